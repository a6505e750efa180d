package compose

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/triage-queue/triage/deploy/drill"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/regions/replication"
)

// The bed's MariaDB admin account (root@'%', made by the image's
// entrypoint; config/bootstrap.json and the controllers' configs name it).
const (
	adminUser     = "root"
	adminPassword = "root"
)

// Bed is a running compose bed: the containers of one docker-compose
// project, found by the labels Generate gives them and driven through the
// docker CLI. It is the compose bed's drill.Bed: a primary-kill is docker
// kill of the primary's container, a region-down docker kill of every
// container of the region, a partition docker network disconnect of the
// region's WAN gateway from "wan" (the region's only way to the others);
// a heal starts and reconnects them.
//
// Inject, Heal and Fate of one fault must come from one Bed: it remembers
// which servers were primaries when the fault began.
type Bed struct {
	project string
	// routers are the routers' published gRPC addresses, found by Open,
	// when all of them run: a killed router's port is not published.
	routers []drill.Router
	// dir is the bed directory on the host (WriteBedDir), found by Open
	// from a router's mounts, and token the API key in it.
	dir, token string

	mu sync.Mutex // guards before
	// before is, per shard, the container of its primary when the last
	// fault was injected (the faulted region's shards; the killed one for
	// primary-kill).
	before map[uint32]container
}

var _ drill.Bed = (*Bed)(nil)

// container is one container of the bed, as docker ps lists it.
type container struct {
	ID, Service, State string
	Region, Role       string
	RegionIndex        int
	Shard              uint32
	Addr, StartedAs    string
}

// Open finds the running compose bed of project (the
// COMPOSE_PROJECT_NAME of make compose-up; "triage" by default).
// Every router must be running.
func Open(ctx context.Context, project string) (*Bed, error) {
	b := &Bed{project: project, before: map[uint32]container{}}
	cs, err := b.containers(ctx)
	if err != nil {
		return nil, err
	}
	if len(cs) == 0 {
		return nil, fmt.Errorf("no compose bed of project %q is running (make compose-up, or --project)", project)
	}
	slices.SortFunc(cs, func(a, b container) int { return cmp.Compare(a.RegionIndex, b.RegionIndex) })
	for _, c := range cs {
		if c.Role != "router" {
			continue
		}
		addr, err := docker(ctx, "port", c.ID, "9090/tcp")
		if err != nil {
			return nil, fmt.Errorf("router of %s: %w", c.Region, err)
		}
		if b.dir == "" {
			if b.dir, err = bedDirOf(ctx, c.ID); err != nil {
				return nil, err
			}
			if b.token, err = readToken(b.dir); err != nil {
				return nil, err
			}
		}
		b.routers = append(b.routers, drill.Router{Region: c.Region, Addr: strings.Fields(addr)[0], Token: b.token})
	}
	if len(b.routers) == 0 {
		return nil, fmt.Errorf("project %s has no router container", project)
	}
	return b, nil
}

// docker runs the docker CLI and returns its standard output; an error
// carries its standard error. The two are kept apart: a warning the CLI
// writes to stderr while it writes a listing would otherwise land inside
// the listing's lines, and a line of docker ps that does not parse is a
// container the bed does not see.
func docker(ctx context.Context, args ...string) (string, error) {
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(ctx, "docker", args...)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("docker %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(errOut.String()+" "+out.String()))
	}
	if w := strings.TrimSpace(errOut.String()); w != "" {
		fmt.Fprintf(os.Stderr, "compose: docker %s said on stderr: %s\n", args[0], w)
	}
	return strings.TrimSpace(out.String()), nil
}

// psFields is the docker ps format of a container line, tab-separated.
var psFields = []string{"{{.ID}}", `{{.Label "com.docker.compose.service"}}`, "{{.State}}", `{{.Label "` + LabelRegion + `"}}`,
	`{{.Label "` + LabelRole + `"}}`, `{{.Label "` + LabelRegionIndex + `"}}`, `{{.Label "` + LabelShard + `"}}`,
	`{{.Label "` + LabelAddr + `"}}`, `{{.Label "` + LabelStartedAs + `"}}`,
	// A last field that is never empty: a line ending in empty labels
	// ends in tabs, which docker's trimmed output loses on the last line
	// (a gateway has no shard, address or start label). A CI run failed a
	// partition drill on it: the gateway docker listed last was dropped.
	"end"}

// containers lists the project's containers, running or not.
func (b *Bed) containers(ctx context.Context) ([]container, error) {
	out, err := docker(ctx, "ps", "-a", "--filter", "label=com.docker.compose.project="+b.project,
		"--format", strings.Join(psFields, "\t"))
	if err != nil {
		return nil, err
	}
	cs, bad := parseContainers(out)
	for _, line := range bad {
		fmt.Fprintf(os.Stderr, "compose: docker ps line not understood (want %d tab-separated fields): %q\n", len(psFields), line)
	}
	return cs, nil
}

// parseContainers reads docker ps lines in the psFields format, sorted by
// service, and returns the lines it could not read.
func parseContainers(out string) (cs []container, bad []string) {
	for line := range strings.Lines(out) {
		f := strings.Split(strings.TrimRight(line, "\n"), "\t")
		if len(f) != len(psFields) {
			if strings.TrimSpace(line) != "" {
				bad = append(bad, line)
			}
			continue
		}
		c := container{ID: f[0], Service: f[1], State: f[2], Region: f[3], Role: f[4], Addr: f[7], StartedAs: f[8]}
		c.RegionIndex, _ = strconv.Atoi(f[5])
		if n, err := strconv.ParseUint(f[6], 10, 32); err == nil {
			c.Shard = uint32(n)
		}
		cs = append(cs, c)
	}
	slices.SortFunc(cs, func(a, b container) int { return cmp.Compare(a.Service, b.Service) })
	return cs, bad
}

// service is the container of service name.
func (b *Bed) service(ctx context.Context, name string) (container, error) {
	cs, err := b.containers(ctx)
	if err != nil {
		return container{}, err
	}
	for _, c := range cs {
		if c.Service == name {
			return c, nil
		}
	}
	return container{}, fmt.Errorf("project %s has no service %s", b.project, name)
}

// Routers lists each region's router by the host address its gRPC port
// was published on when Open ran, in region order, with the bed's API
// key. (A router restarted
// after a region-down keeps its port when the port is fixed, as in make
// compose-up; with TRIAGE_GRPC_*=0 Docker gives it another.)
func (b *Bed) Routers(context.Context) ([]drill.Router, error) {
	return slices.Clone(b.routers), nil
}

// shardMap is the newest shard map any router serves: right after a
// partition heals, the healed region's router may still serve the one
// from before the cut.
func (b *Bed) shardMap(ctx context.Context) (*triagev1.ShardMap, error) {
	var newest *triagev1.ShardMap
	var errs []error
	for _, r := range b.routers {
		conn, err := grpc.NewClient(r.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(bearer(r.Token)))
		if err != nil {
			return nil, err
		}
		rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		m, err := triagev1.NewAdminClient(conn).GetShardMap(rctx, &triagev1.GetShardMapRequest{})
		cancel()
		conn.Close()
		if err != nil {
			errs = append(errs, fmt.Errorf("router of %s: %w", r.Region, err))
			continue
		}
		if newest == nil || m.Version > newest.Version {
			newest = m
		}
	}
	if newest == nil {
		return nil, fmt.Errorf("no router answered with the shard map: %w", errors.Join(errs...))
	}
	return newest, nil
}

// primaryOf is shard's primary address in m ("" if m lacks the shard).
func primaryOf(m *triagev1.ShardMap, shard uint32) string {
	for _, s := range m.Shards {
		if s.Id == shard {
			return s.Primary
		}
	}
	return ""
}

// remember records, per shard, the container of the primary m names,
// for the shards whose primary runs in region (or just shard).
func (b *Bed) remember(cs []container, m *triagev1.ShardMap, region string, shard uint32) {
	b.mu.Lock()
	defer b.mu.Unlock()
	clear(b.before)
	for _, s := range m.Shards {
		for _, c := range cs {
			if c.Role == "mariadb" && c.Addr == s.Primary && (shard == 0 && c.Region == region || shard == s.Id) {
				b.before[s.Id] = c
			}
		}
	}
}

// Inject injects f; see drill.Bed. It looks up what it needs first and
// then acts, so the fault lands at once, and says when it took effect:
// for a kill, when docker was asked (see kill); for a partition, the
// disconnect's event.
func (b *Bed) Inject(ctx context.Context, f drill.Fault) (drill.Injection, error) {
	cs, err := b.containers(ctx)
	if err != nil {
		return drill.Injection{}, err
	}
	m, err := b.shardMap(ctx)
	if err != nil {
		return drill.Injection{}, err
	}
	of := func(role string) (container, error) {
		for _, c := range cs {
			if c.Region == f.Region && c.Role == role {
				return c, nil
			}
		}
		// Say what was seen: a CI run once failed here with every gateway
		// up (see compose.Bed.containers, which drops lines it cannot parse).
		seen := make([]string, 0, len(cs))
		for _, c := range cs {
			seen = append(seen, c.Region+"/"+c.Role+"/"+c.State)
		}
		return container{}, fmt.Errorf("region %q has no %s container among the %d of project %s: %v", f.Region, role, len(cs), b.project, seen)
	}
	switch f.Scenario {
	case "primary-kill":
		b.remember(cs, m, "", f.Shard)
		b.mu.Lock()
		c, ok := b.before[f.Shard]
		b.mu.Unlock()
		if !ok {
			return drill.Injection{}, fmt.Errorf("shard %d: no container of the bed is its primary %q", f.Shard, primaryOf(m, f.Shard))
		}
		at, err := kill(ctx, c)
		return drill.Injection{At: at, Description: fmt.Sprintf("docker kill of shard %d's primary %s (container %s, region %s, started as %s)",
			f.Shard, c.Addr, c.Service, c.Region, c.StartedAs)}, err
	case "region-down":
		b.remember(cs, m, f.Region, 0)
		var victims []container
		var names []string
		for _, c := range cs {
			if c.Region == f.Region && c.State == "running" {
				victims, names = append(victims, c), append(names, c.Service)
			}
		}
		if len(victims) == 0 {
			return drill.Injection{}, fmt.Errorf("region %q has no running container", f.Region)
		}
		at, err := kill(ctx, victims...)
		return drill.Injection{At: at, Description: fmt.Sprintf("region %s down: docker kill of its %d containers (%s)",
			f.Region, len(victims), strings.Join(names, ", "))}, err
	case "partition":
		b.remember(cs, m, f.Region, 0)
		gw, err := of("wan")
		if err != nil {
			return drill.Injection{}, err
		}
		network, err := b.network(ctx, "wan")
		if err != nil {
			return drill.Injection{}, err
		}
		since := time.Now()
		if _, err := docker(ctx, "network", "disconnect", network, gw.ID); err != nil {
			return drill.Injection{}, err
		}
		at, err := disconnectedAt(ctx, network, gw.ID, since)
		return drill.Injection{At: at, Description: fmt.Sprintf("%s disconnected from network %s_wan: %s's containers reach no other region and no other region reaches them",
			gw.Service, b.project, f.Region)}, err
	case "mariadb-pause", "wan-spike":
		return b.injectMore(ctx, f, cs, m, of)
	case "nats-kill", "dequeuer-kill", "enqueuer-kill":
		c, err := of(strings.TrimSuffix(f.Scenario, "-kill"))
		if err != nil {
			return drill.Injection{}, err
		}
		at, err := kill(ctx, c)
		return drill.Injection{At: at, Description: "docker kill of " + c.Service}, err
	}
	return drill.Injection{}, fmt.Errorf("unknown scenario %q: allowed %s", f.Scenario, strings.Join(drill.Scenarios, ", "))
}

// kill docker-kills cs, all at once, and returns when docker was asked
// to: never later than the fault, so a drill timed from it never
// measures a recovery too short. Docker's own times come later than the
// fault: the container's end (State.FinishedAt) after its teardown, up to
// 1.8 s after mariadbd died on this bed's storage driver, and even the
// kill event, sent once containerd returned, 0.6 s after the clients'
// first connection errors. The CLI's start-up counts against the RTO
// instead: tens of milliseconds on a quiet box.
func kill(ctx context.Context, cs ...container) (time.Time, error) {
	asked := time.Now()
	errs := make([]error, len(cs))
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Go(func() { _, errs[i] = docker(ctx, "kill", c.ID) })
	}
	wg.Wait()
	return asked, errors.Join(errs...)
}

// disconnectedAt is when docker disconnected the container id from
// network, after since, by its event.
func disconnectedAt(ctx context.Context, network, id string, since time.Time) (time.Time, error) {
	unix := func(t time.Time) string { return fmt.Sprintf("%d.%09d", t.Unix(), t.Nanosecond()) }
	out, err := docker(ctx, "events", "--since", unix(since.Add(-time.Second)), "--until", unix(time.Now()),
		"--filter", "type=network", "--filter", "event=disconnect", "--filter", "network="+network,
		"--format", `{{.TimeNano}} {{index .Actor.Attributes "container"}}`)
	if err != nil {
		return time.Time{}, err
	}
	for line := range strings.Lines(out) {
		f := strings.Fields(line)
		if len(f) == 2 && strings.HasPrefix(f[1], id) {
			ns, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil {
				return time.Time{}, err
			}
			return time.Unix(0, ns), nil
		}
	}
	return time.Time{}, fmt.Errorf("no disconnect event of %s from network %s: %q", id, network, out)
}

// Heal heals f; see drill.Bed. Then it plays the operator for any
// deposed primary left writable (superviseDeposed).
func (b *Bed) Heal(ctx context.Context, f drill.Fault) (string, error) {
	desc, err := b.healFault(ctx, f)
	if more := b.superviseDeposed(ctx); more != "" {
		desc += "; " + more
	}
	return desc, err
}

// healFault heals f alone.
func (b *Bed) healFault(ctx context.Context, f drill.Fault) (string, error) {
	cs, err := b.containers(ctx)
	if err != nil {
		return "", err
	}
	m, err := b.shardMap(ctx)
	if err != nil {
		return "", err
	}
	b.mu.Lock()
	before := maps.Clone(b.before)
	b.mu.Unlock()
	// deposed says whether c was a shard's primary when the fault began
	// and the shard has failed over since: it must come back through
	// crash recovery as a replica.
	deposed := func(c container) bool {
		p, ok := before[c.Shard]
		return ok && p.ID == c.ID && primaryOf(m, c.Shard) != c.Addr
	}
	switch f.Scenario {
	case "primary-kill":
		c, ok := before[f.Shard]
		if !ok {
			return "", fmt.Errorf("shard %d: no primary-kill to heal", f.Shard)
		}
		return b.startServers(ctx, []container{c}, deposed)
	case "region-down":
		return b.healRegionDown(ctx, f.Region, cs, deposed)
	case "partition":
		return b.healPartition(ctx, f.Region, before, deposed)
	case "mariadb-pause", "wan-spike":
		return b.healMore(ctx, f)
	case "nats-kill", "dequeuer-kill", "enqueuer-kill":
		c, err := b.service(ctx, strings.TrimSuffix(f.Scenario, "-kill")+"-"+f.Region)
		if err != nil {
			return "", err
		}
		if err := b.start(ctx, []container{c}); err != nil {
			return "", err
		}
		return c.Service + " started again", nil
	}
	return "", fmt.Errorf("unknown scenario %q: allowed %s", f.Scenario, strings.Join(drill.Scenarios, ", "))
}

// healRegionDown starts region's stopped containers of cs in the order
// they depend on each other: the gateway first, so that the servers can
// reach their primaries, and the servers and NATS answering before the
// Triage roles start.
func (b *Bed) healRegionDown(ctx context.Context, region string, cs []container, deposed func(container) bool) (string, error) {
	var order [4][]container // gateway, MariaDB, NATS, Triage roles
	for _, c := range cs {
		if c.Region != region || c.State == "running" {
			continue
		}
		switch c.Role {
		case "wan":
			order[0] = append(order[0], c)
		case "mariadb":
			order[1] = append(order[1], c)
		case "nats":
			order[2] = append(order[2], c)
		default:
			order[3] = append(order[3], c)
		}
	}
	if err := b.start(ctx, order[0]); err != nil {
		return "", err
	}
	desc, err := b.startServers(ctx, order[1], deposed)
	if err != nil {
		return "", err
	}
	parts := []string{desc}
	for _, group := range order[2:] {
		if err := b.start(ctx, group); err != nil {
			return "", err
		}
		for _, c := range group {
			parts = append(parts, c.Service+" started")
		}
	}
	return "region " + region + " back: " + strings.Join(parts, "; "), nil
}

// healPartition reconnects region's WAN gateway and restarts the deposed
// primaries among before to rejoin. They are crashed before the cut
// heals: an old primary still running in the cut region would, on a
// clean shutdown or with its replicas coming back, complete commits no
// replica acknowledged, and could never rejoin. Crash recovery with
// RejoinArgs drops them.
func (b *Bed) healPartition(ctx context.Context, region string, before map[uint32]container, deposed func(container) bool) (string, error) {
	var crashed []container
	for _, c := range before {
		if deposed(c) {
			crashed = append(crashed, c)
		}
	}
	if len(crashed) > 0 {
		if _, err := kill(ctx, crashed...); err != nil {
			return "", err
		}
	}
	gw, err := b.service(ctx, gateway(region))
	if err != nil {
		return "", err
	}
	network, err := b.network(ctx, "wan")
	if err != nil {
		return "", err
	}
	if _, err := docker(ctx, "network", "connect", "--alias", gw.Service, network, gw.ID); err != nil {
		return "", err
	}
	desc := "no primary to restart"
	if len(crashed) > 0 {
		if desc, err = b.startServers(ctx, crashed, deposed); err != nil {
			return "", err
		}
	}
	return gw.Service + " reconnected to " + b.project + "_wan; " + desc, nil
}

// startServers starts MariaDB containers: a deposed primary with
// replication.RejoinArgs for this start (the entrypoint reads them from
// next-start-args in its volume), so that crash recovery drops what no
// replica acknowledged and the controller rejoins it as a replica; a
// primary the shard did not fail over from as the primary again, with
// semi-sync turned back on (it is a runtime setting); a replica as it was.
func (b *Bed) startServers(ctx context.Context, cs []container, deposed func(container) bool) (string, error) {
	if len(cs) == 0 {
		return "no MariaDB server to start", nil
	}
	dir, err := os.MkdirTemp("", "triage-rejoin-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	args := filepath.Join(dir, "next-start-args")
	if err := os.WriteFile(args, []byte(strings.Join(replication.RejoinArgs(), "\n")+"\n"), 0o644); err != nil {
		return "", err
	}
	var parts []string
	for _, c := range cs {
		if deposed(c) {
			if _, err := docker(ctx, "cp", args, c.ID+":/var/lib/mysql/next-start-args"); err != nil {
				return "", err
			}
			parts = append(parts, fmt.Sprintf("%s (shard %d's old primary) started to rejoin as a replica", c.Service, c.Shard))
		} else {
			parts = append(parts, c.Service+" started")
		}
	}
	if err := b.start(ctx, cs); err != nil {
		return "", err
	}
	m, err := b.shardMap(ctx)
	if err != nil {
		return "", err
	}
	for _, c := range cs {
		if primaryOf(m, c.Shard) != c.Addr {
			continue
		}
		a, err := b.admin(ctx, c)
		if err != nil {
			return "", err
		}
		err = a.EnableSemiSync(ctx, true)
		a.Close()
		if err != nil {
			return "", fmt.Errorf("%s: semi-sync back on: %w", c.Service, err)
		}
		parts = append(parts, c.Service+" is still the primary: semi-sync on again")
	}
	return strings.Join(parts, "; "), nil
}

// start starts cs and waits until they serve: a MariaDB server until it
// answers an admin connection, a NATS server until its /healthz answers
// ok (both reached from the host, on their region's network), anything
// else until docker has it running. Docker's health checks run every 15 s,
// too seldom to wait on.
func (b *Bed) start(ctx context.Context, cs []container) error {
	if len(cs) == 0 {
		return nil
	}
	var ids []string
	for _, c := range cs {
		ids = append(ids, c.ID)
	}
	if _, err := docker(ctx, append([]string{"start"}, ids...)...); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	errs := make([]error, len(cs))
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Go(func() { errs[i] = b.waitServing(ctx, c) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// waitServing polls c until it serves (see start) or ctx ends.
func (b *Bed) waitServing(ctx context.Context, c container) error {
	var last error
	for {
		last = b.serving(ctx, c)
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			logs, _ := docker(context.Background(), "logs", "--tail", "20", c.ID)
			return fmt.Errorf("%s does not serve after it was started: %w\n%s", c.Service, last, logs)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func (b *Bed) serving(ctx context.Context, c container) error {
	state, err := docker(ctx, "inspect", "-f", "{{.State.Status}} {{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}", c.ID)
	if err != nil {
		return err
	}
	f := strings.Fields(state)
	switch {
	case len(f) == 0 || f[0] != "running":
		return fmt.Errorf("state %q", state)
	case c.Role == "mariadb":
		a, err := b.admin(ctx, c)
		if err != nil {
			return err
		}
		defer a.Close()
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err = a.Status(sctx)
		return err
	case c.Role == "nats" && len(f) > 1:
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(rctx, http.MethodGet, "http://"+net.JoinHostPort(f[1], "8222")+"/healthz", nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("NATS /healthz: %s", resp.Status)
		}
	}
	return nil
}

// network is the ID of the project's network name.
func (b *Bed) network(ctx context.Context, name string) (string, error) {
	out, err := docker(ctx, "network", "ls", "-q", "--filter", "label=com.docker.compose.project="+b.project,
		"--filter", "label=com.docker.compose.network="+name)
	if err != nil {
		return "", err
	}
	if out == "" {
		return "", fmt.Errorf("project %s has no network %s", b.project, name)
	}
	return strings.Fields(out)[0], nil
}

// admin opens an admin connection to c's mariadbd at its address on its
// region's network, which the Docker host reaches directly (no port is
// published, and nothing crosses "wan").
func (b *Bed) admin(ctx context.Context, c container) (*replication.Admin, error) {
	ip, err := docker(ctx, "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}", c.ID)
	if err != nil {
		return nil, err
	}
	if len(strings.Fields(ip)) == 0 {
		return nil, fmt.Errorf("%s has no address", c.Service)
	}
	mc := mysql.NewConfig()
	mc.User, mc.Passwd, mc.Net, mc.Addr = adminUser, adminPassword, "tcp", strings.Fields(ip)[0]+":3306"
	mc.Timeout = 2 * time.Second
	return replication.Open(mc.FormatDSN())
}

// Fate says what the shard's primary from before the fault is now; see
// drill.Bed.
func (b *Bed) Fate(ctx context.Context, f drill.Fault) (string, error) {
	switch f.Scenario {
	case "nats-kill", "dequeuer-kill", "enqueuer-kill", "wan-spike":
		return "not applicable: no primary was faulted", nil
	}
	b.mu.Lock()
	old, ok := b.before[f.Shard]
	b.mu.Unlock()
	if !ok {
		return "", fmt.Errorf("shard %d: no fault of its primary to describe", f.Shard)
	}
	a, err := b.admin(ctx, old)
	if err != nil {
		return "unreachable: " + err.Error(), nil
	}
	defer a.Close()
	// The controller rejoins it within a few passes; give it that long.
	var st replication.Status
	moved := false
	deadline := time.Now().Add(15 * time.Second)
	for {
		if m, err := b.shardMap(ctx); err == nil {
			moved = primaryOf(m, f.Shard) != old.Addr
		}
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err = a.Status(sctx)
		cancel()
		if err == nil && (!moved || st.IOThreadRunning()) || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	switch {
	case err != nil:
		return "down: " + err.Error(), nil
	case !moved:
		return fmt.Sprintf("still the primary (%s, read_only=%v): no failover happened", old.Addr, st.ReadOnly), nil
	case st.IOThreadRunning():
		return fmt.Sprintf("rejoined as a read-only replica of %s (read_only=%v, at %s)", b.describe(st.PrimaryAddr), st.ReadOnly, st.CurrentPos), nil
	default:
		return fmt.Sprintf("not replicating (read_only=%v, IO %s, last error %q): needs a rebuild from the new primary",
			st.ReadOnly, st.IORunning, st.LastIOError), nil
	}
}

// describe names a gateway address such as wan-us-east:30011 by the
// server behind it.
func (b *Bed) describe(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || !strings.HasPrefix(host, "wan-") {
		return addr
	}
	p, _ := strconv.Atoi(port)
	shard, region, ok := serverAt(p)
	if !ok {
		return addr
	}
	cs, err := b.containers(context.Background())
	if err != nil {
		return addr
	}
	for _, c := range cs {
		if c.Role == "mariadb" && c.Shard == shard && c.RegionIndex == region {
			return fmt.Sprintf("%s (through %s)", c.Addr, addr)
		}
	}
	return addr
}

// RoundTrips measures a round trip from region from to a MariaDB server
// of each other region, as a client in from sees it: one of from's
// MariaDB containers runs `mariadb -vvv` with SELECT 1 five times on one
// connection through from's gateway, per other region, and the fastest
// statement's time is that region's figure (millisecond resolution, as
// the client prints it). A probe that fails or hangs (bounded by
// roundTripProbe) is reported with each hop's view of it (stalled).
func (b *Bed) RoundTrips(ctx context.Context, from string) (map[string]time.Duration, error) {
	cs, err := b.containers(ctx)
	if err != nil {
		return nil, err
	}
	var client *container
	servers := map[string]container{} // one per other region
	for i, c := range cs {
		switch {
		case c.Role != "mariadb" || c.State != "running":
		case c.Region == from && client == nil:
			client = &cs[i]
		case c.Region != from:
			if _, ok := servers[c.Region]; !ok {
				servers[c.Region] = c
			}
		}
	}
	if client == nil || len(servers) == 0 {
		return nil, fmt.Errorf("no running MariaDB container in %s, or none elsewhere", from)
	}
	rtt := map[string]time.Duration{}
	for r, c := range servers {
		// A probe of its own per region, bounded, so that a connection
		// that hangs is reported with where its bytes stopped rather than
		// killed with the caller's context.
		pctx, cancel := context.WithTimeout(ctx, roundTripProbe)
		out, err := docker(pctx, "exec", client.ID, "mariadb", "--connect-timeout=20", "-h", gateway(from),
			"-P", strconv.Itoa(mysqlPort(c.Shard, c.RegionIndex)), "-u"+adminUser, "-p"+adminPassword, "-vvv", "-e", strings.Repeat("SELECT 1;", 5))
		cancel()
		if err != nil {
			return nil, fmt.Errorf("round trip %s -> %s (%s through %s): %w\n%s", from, r, c.Addr, gateway(from), err,
				b.stalled(context.WithoutCancel(ctx), from, c))
		}
		for line := range strings.Lines(out) {
			m := statementTime.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			sec, err := strconv.ParseFloat(m[1], 64)
			if err != nil {
				continue
			}
			if d, ok := rtt[r]; !ok || time.Duration(sec*float64(time.Second)) < d {
				rtt[r] = time.Duration(sec * float64(time.Second))
			}
		}
		if _, ok := rtt[r]; !ok {
			return nil, fmt.Errorf("no statement time to %s in the output of mariadb -vvv: %s", r, out)
		}
	}
	return rtt, nil
}

// roundTripProbe bounds one region's probe in RoundTrips: a connection
// and five statements across a 40 ms round trip take well under a second.
const roundTripProbe = 45 * time.Second

// stalled describes, for a probe from region from to server that failed,
// each hop's view of the connection: the open connections of from's
// gateway and of server's region's gateway with the bytes they passed on
// each way (GET /links), and server's process list. A handshake whose
// greeting never came back shows where it stopped.
func (b *Bed) stalled(ctx context.Context, from string, server container) string {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	var out strings.Builder
	for _, r := range []string{from, server.Region} {
		gw, err := b.service(ctx, gateway(r))
		if err != nil {
			fmt.Fprintf(&out, "%s: %v\n", gateway(r), err)
			continue
		}
		links, err := docker(ctx, "exec", gw.ID, "/triage", "probe", "http://127.0.0.1:7070/links")
		fmt.Fprintf(&out, "%s GET /links: %s%v\n", gateway(r), links, errOrNil(err))
	}
	pl, err := docker(ctx, "exec", server.ID, "mariadb", "-uroot", "-e", "SHOW FULL PROCESSLIST") // the socket: no password
	fmt.Fprintf(&out, "%s SHOW FULL PROCESSLIST:\n%s%v", server.Addr, pl, errOrNil(err))
	return out.String()
}

// errOrNil prints err after a space, or nothing.
func errOrNil(err error) string {
	if err == nil {
		return ""
	}
	return " " + err.Error()
}

// statementTime is how mariadb -vvv reports a statement's time: "1 row in
// set (0.041 sec)".
var statementTime = regexp.MustCompile(`row in set \((\d+\.\d+) sec\)`)
