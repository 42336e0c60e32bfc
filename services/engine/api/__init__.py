"""The agent-facing HTTP API: OpenAI and Anthropic over a generate backend (an engine core in
this process, or the router), served on every rank and on the fleet's router front.

Nothing here imports torch: the router process serves it too.
"""
