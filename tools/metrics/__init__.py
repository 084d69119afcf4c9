"""Operations: the Grafana dashboard, metric docs and the status-page browser test helpers."""
