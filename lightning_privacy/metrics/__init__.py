"""torchmetrics.Metric classes: state and cross-process sync only."""
