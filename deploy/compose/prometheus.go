package compose

import (
	"net"
	"strings"
)

// Prometheus on the bed: one server on every region's network, which
// scrapes every role container's metrics listener (metricsListen: no key,
// never published on the host) and evaluates the repository's alert
// rules, so the rules and the metrics they name are exercised on a running
// multi-region bed and not only by promtool's unit tests. Its image is the
// bed's Debian root file system (build-images.sh); Grafana is not in
// Debian, so deploy/grafana/triage.json is imported by hand.

// prometheusImage is the Prometheus image build-images.sh tags.
const prometheusImage = "${TRIAGE_PROMETHEUS_IMAGE:?run deploy/compose/build-images.sh and pass --env-file}"

// PrometheusPort is the host loopback port Prometheus' API and UI are
// published on, beside the routers' 18080... and 19090...;
// TRIAGE_PROMETHEUS overrides it (0: a free port, see docker port).
const PrometheusPort = 19190

// alertRules is the alert rules file, relative to this directory: the
// one `make check-alerts` checks, mounted as it is.
const alertRules = "../prometheus/alerts.yml"

// scrapeJob is the job label of every role's series, which the alert
// rules select on.
const scrapeJob = "triage"

// metricsPort is metricsListen's port, where Prometheus scrapes.
func metricsPort() string {
	_, port, _ := net.SplitHostPort(metricsListen) // a constant host:port
	return port
}

// prometheusConfig is config/prometheus.yml: every role container of t as
// a target labelled with its region and role, which the alert rules
// aggregate and report by.
func prometheusConfig(t Topology) []byte {
	var b writer
	w := b.w
	w("# Prometheus of the compose bed, written by generate.go (go generate\n")
	w("# ./deploy/compose; do not edit): every role container's metrics listener,\n")
	w("# labelled with its region and role, and the alert rules of\n")
	w("# deploy/prometheus/alerts.yml (mounted at /etc/prometheus/alerts.yml).\n")
	w("global:\n  scrape_interval: 15s\n  evaluation_interval: 15s\n")
	w("rule_files:\n  - /etc/prometheus/alerts.yml\n")
	w("scrape_configs:\n  - job_name: %s\n    static_configs:\n", scrapeJob)
	for _, r := range t.Regions {
		for _, role := range roles {
			w("      - targets: [\"%s-%s:%s\"]\n", role, r, metricsPort())
			w("        labels: {region: %s, role: %s}\n", r, role)
		}
	}
	return b.Bytes()
}

// prometheusService writes the Prometheus service of the compose file.
// It starts with the roles, after the bootstrap: earlier, every role
// would be down for the minute or two the bed takes to start, and
// TriageNodeDown fire on every start. It has no health check (Debian's
// Prometheus 2.42 has no probe command, and the image no curl) and
// nothing waits for it: a target that is not up yet is a failed scrape,
// retried 15 s later.
func (b *writer) prometheusService(t Topology) {
	w := b.w
	w("\n  # Prometheus (Debian's), on every region's network: it scrapes every role's\n")
	w("  # metrics listener (port %s, not published) and evaluates the alert rules\n", metricsPort())
	w("  # of deploy/prometheus. Its API and UI are on the host's loopback.\n")
	w("  prometheus:\n    image: %s\n", prometheusImage)
	w("    volumes:\n      - ./config/prometheus.yml:/etc/prometheus/prometheus.yml:ro\n")
	w("      - %s:/etc/prometheus/alerts.yml:ro\n", alertRules)
	w("    ports:\n      - \"127.0.0.1:${TRIAGE_PROMETHEUS:-%d}:9090\"\n", PrometheusPort)
	b.labels(LabelRole, "prometheus")
	w("    networks: [%s]\n", strings.Join(t.Regions, ", "))
	w("    depends_on:\n      bootstrap:\n        condition: service_completed_successfully\n")
}
