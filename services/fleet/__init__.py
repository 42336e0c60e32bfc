"""A whole fleet in one process: the router, engine ranks and the OpenAI HTTP front composed
(`embedded.py`), the `kvfleet up` command (`up.py`) and its smoke check (`smoke.py`).

Above the engine and the router, which never import each other.
"""
