"""Whole measured runs, replayed through the simulator: AIConfigurator's H100 vLLM runs
(silicon_rows reads them, silicon replays them and tables the errors)."""
