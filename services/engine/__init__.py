"""One engine rank, in sub-packages with one job each that import downward only (the engine
contract in `.importlinter`; tests/test_import_layers.py also refuses any import cycle, a
function-level import included):

    rank       the process: `EngineRank`, the gRPC service, the router link, peer routers'
               worker endpoints, pod ranks, `kvfleet engine`
    api        the OpenAI and Anthropic HTTP API over a generate backend: bodies, parameters,
               shapes, errors, tool calls, chat templates, the uvicorn server; the fleet's
               router front serves the same app over the router
    core       `EngineCore` (the thread that owns the kvstore manager, the scheduler and the
               compute backend), the scheduler, request checks, detokenizer, KV events, metrics
    compute    compute backends (`torch`, `sim`), sampling, grammar masks, decode graphs, the
               tensor-parallel worker group and tp/
    model      the decoder, its layers and architectures, checkpoints, weights, tokenizers,
               local model directories
    attention  paged attention backends and the forward batch they read
    kv         the device KV: paged tensors, the model's view of the tiers, sizing, fp8 scales
    config     what a rank runs with: `ModelConfig` presets, `EngineConfig`, engine.yaml
    request    what a request is on its way through: the call and its outputs, sampling
               parameters, grammar state, its samples and a sample's share of a step

config and request import nothing of each other. The packages' `__init__` modules import
nothing, so importing one light module (the `kvfleet` command's parsers) never imports torch.
"""
