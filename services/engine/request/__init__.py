"""What a request is on its way through the engine: the call, its sampling and grammar, its
samples and a sample's share of a step. No torch here (the API front validates requests)."""
