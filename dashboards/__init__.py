"""Dashboards as code (the committed JSON is generated), their push to Grafana, PNG renders from Prometheus, the alert
rules."""
