package compose

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// TestPrometheusScrapesEveryRole: config/prometheus.yml names every role
// container's metrics listener once, labelled with its region and role
// (what the alert rules aggregate by), and the alert rules' file; the
// Prometheus service is on every region's network, where those names
// resolve, mounts both files (the rules from deploy/prometheus, which
// exists), publishes its port on the host's loopback only and starts with
// the roles, after the bootstrap.
func TestPrometheusScrapesEveryRole(t *testing.T) {
	t.Parallel()
	top := DefaultTopology()
	top.Regions = append(top.Regions, "sa-east")
	files, err := Generate(top)
	require.NoError(t, err)
	var cfg struct {
		RuleFiles     []string `yaml:"rule_files"`
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			StaticConfigs []struct {
				Targets []string          `yaml:"targets"`
				Labels  map[string]string `yaml:"labels"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	require.NoError(t, yaml.Unmarshal(files["config/prometheus.yml"], &cfg))
	require.Equal(t, []string{"/etc/prometheus/alerts.yml"}, cfg.RuleFiles)
	require.Len(t, cfg.ScrapeConfigs, 1)
	require.Equal(t, scrapeJob, cfg.ScrapeConfigs[0].JobName)
	got := map[string]map[string]string{}
	for _, sc := range cfg.ScrapeConfigs[0].StaticConfigs {
		for _, target := range sc.Targets {
			require.NotContains(t, got, target)
			got[target] = sc.Labels
		}
	}
	want := map[string]map[string]string{}
	for _, r := range top.Regions {
		for _, role := range roles {
			want[fmt.Sprintf("%s-%s:9100", role, r)] = map[string]string{"region": r, "role": role}
		}
	}
	require.Equal(t, want, got)

	c := parseCompose(t, files["docker-compose.yml"])
	p, ok := c.Services["prometheus"]
	require.True(t, ok)
	require.Contains(t, p.Image, "TRIAGE_PROMETHEUS_IMAGE")
	require.Equal(t, names(top.Regions), p.Networks)
	require.Equal(t, []string{"./config/prometheus.yml:/etc/prometheus/prometheus.yml:ro", alertRules + ":/etc/prometheus/alerts.yml:ro"}, p.Volumes)
	require.FileExists(t, filepath.FromSlash(alertRules))
	require.Equal(t, []string{fmt.Sprintf("127.0.0.1:${TRIAGE_PROMETHEUS:-%d}:9090", PrometheusPort)}, p.Ports)
	require.Equal(t, "prometheus", p.Labels[LabelRole])
	require.Empty(t, p.Labels[LabelRegion], "no region's drill stops it")
	require.Equal(t, "service_completed_successfully", p.DependsOn["bootstrap"]["condition"], "it starts with the roles")
}

// TestOnlyTheGatewaysRunBedTools: every Triage container runs the
// production image (triage alone) but the WAN gateways, which run the
// bed-tools image and are the only ones to name triage-bed.
func TestOnlyTheGatewaysRunBedTools(t *testing.T) {
	t.Parallel()
	files, err := Generate(DefaultTopology())
	require.NoError(t, err)
	c := parseCompose(t, files["docker-compose.yml"])
	gateways := 0
	for name, s := range c.Services {
		usesBed := slices.ContainsFunc(append(s.Entrypoint, s.Command...), func(a string) bool { return strings.Contains(a, "triage-bed") })
		switch s.Labels[LabelRole] {
		case "wan":
			gateways++
			require.Equal(t, bedImage, s.Image, name)
			require.True(t, usesBed, name)
		case "mariadb":
			require.Contains(t, s.Image, "TRIAGE_MARIADB_IMAGE", name)
		case "prometheus":
			require.Equal(t, prometheusImage, s.Image, name)
		default:
			require.Equal(t, triageImage, s.Image, name)
			require.False(t, usesBed, name)
		}
	}
	require.Equal(t, len(DefaultTopology().Regions), gateways)
	yml := string(files["docker-compose.yml"])
	require.Equal(t, len(DefaultTopology().Regions), strings.Count(yml, "TRIAGE_BED_IMAGE"), "the gateways' image and nothing else")
	data, err := os.ReadFile("build-images.sh")
	require.NoError(t, err)
	for _, v := range []string{"TRIAGE_IMAGE", "TRIAGE_BED_IMAGE", "TRIAGE_MARIADB_IMAGE", "TRIAGE_PROMETHEUS_IMAGE"} {
		require.Contains(t, string(data), v+"=", "build-images.sh writes the variable docker-compose.yml reads")
	}
}
