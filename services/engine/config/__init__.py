"""What an engine rank runs with: the model's shape, the rank's settings, engine.yaml."""
