"""The serving core: what the engine, the simulator and disaggregation share.

Below the engine, router, replay and disagg packages and above kvstore, so that none of those
imports another for these: the step rule (`step_planner.py`, `retained_order.py`), the cost
model of one step (`cost_model.py`, `cost_figures.py`, `sim_costs.yaml`), the disk tier's
per-model folder (`model_disk.py`) and the processes' stop signals (`stop_signals.py`).
"""
