"""Model architectures: Hugging Face `config.json` -> ModelConfig, and the parts beyond Llama's.

`registry.py` maps each supported `architectures` name to its config reader; `rope.py` holds
the RoPE scaling rules and `moe.py` the routed-experts MLP.
"""
