// The custom resource definitions the chart's objects are checked against by
// the real API server: cert-manager's (Issuer, Certificate) and the Prometheus
// Operator's (ServiceMonitor, PrometheusRule), as their modules ship them.
// tests/gotools.py downloads them through the module proxy; nothing is built.
module gpushare-webhook/gotools/crds

go 1.26.0

require (
	github.com/cert-manager/cert-manager v1.21.2
	github.com/prometheus-operator/prometheus-operator v0.85.0
)
