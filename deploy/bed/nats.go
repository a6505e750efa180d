package bed

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/triage-queue/triage/cmd/triage/natsserver"
	"github.com/triage-queue/triage/cmd/triage/provision"
	"github.com/triage-queue/triage/deploy/freeport"
	"github.com/triage-queue/triage/shardmap"
)

// unreachableRoute is what each NATS server of the bed advertises as its
// route address. A server that hears of a peer through a third one dials
// the advertised address (an "implicit route"); refused at once, it gives
// up, and the configured route through the WAN link stays the only path.
// Without it the gossip would open direct routes that bypass the latency
// and survive a Cut.
const unreachableRoute = "127.0.0.1:1"

// jetStreamReadyTimeout bounds the wait for a clustered JetStream to elect
// its meta leader and place a replicated bucket.
const jetStreamReadyTimeout = 60 * time.Second

func (b *Bed) natsPort(i int) int {
	if b.cfg.NATSPort < 0 {
		return 0
	}
	return b.cfg.NATSPort + i
}

// startNATS starts one NATS server per region: standalone for one region,
// otherwise a cluster whose routes all go through WAN links, and waits
// until JetStream answers.
func (b *Bed) startNATS(ctx context.Context) error {
	if !b.multi() {
		r := b.regions[0]
		cfg := natsserver.Config{Port: b.natsPort(0), StoreDir: filepath.Join(b.tmp, "nats"), Auth: b.natsAuth, TLS: b.natsTLS}
		s, err := natsserver.Start(cfg)
		if err != nil {
			return err
		}
		cfg.Port = natsserver.Port(s) // a restart comes back on the same port
		r.nats, r.natsCfg = s, cfg
		b.Layout.NATS = s.ClientURL()
		b.Layout.Processes = append(b.Layout.Processes, Process{Role: RoleNATS, Region: r.name, Port: natsserver.Port(s), PID: os.Getpid()})
		b.progress("NATS %s (JetStream)", s.ClientURL())
		return nil
	}
	b.progress("starting a NATS cluster of %d servers, routes through the WAN", len(b.regions))
	for _, r := range b.regions {
		p, err := freeport.Pick()
		if err != nil {
			return err
		}
		r.clusterPort = p
	}
	routes := map[string][]string{}
	for _, from := range b.regions {
		for _, to := range b.regions {
			if from == to {
				continue
			}
			listen, err := b.net.Link(from.name+">"+to.name+"/nats", from.name, to.name, fmt.Sprintf("127.0.0.1:%d", to.clusterPort), b.cfg.WANLatency)
			if err != nil {
				return err
			}
			routes[from.name] = append(routes[from.name], "nats-route://"+listen)
		}
	}
	err := provision.Parallel(len(b.regions), func(i int) error {
		r := b.regions[i]
		cfg := natsserver.Config{
			Name:             "triage-" + r.name,
			Port:             b.natsPort(i),
			StoreDir:         filepath.Join(b.tmp, "nats-"+r.name),
			ClusterName:      "triage",
			ClusterPort:      r.clusterPort,
			Routes:           routes[r.name],
			ClusterAdvertise: unreachableRoute,
			NoAdvertise:      true,
			Tags:             []string{"region:" + r.name},
			Auth:             b.natsAuth,
			TLS:              b.natsTLS,
			RouteAuth:        b.routeAuth,
		}
		s, err := natsserver.Start(cfg)
		if err != nil {
			return fmt.Errorf("nats of %s: %w", r.name, err)
		}
		cfg.Port = natsserver.Port(s)
		r.nats, r.natsCfg = s, cfg
		return nil
	})
	if err != nil {
		return err
	}
	b.Layout.NATS = b.regions[0].nats.ClientURL()
	for _, r := range b.regions {
		b.Layout.Processes = append(b.Layout.Processes, Process{Role: RoleNATS, Region: r.name, Port: natsserver.Port(r.nats), ClusterPort: r.clusterPort, PID: os.Getpid()})
		b.progress("  NATS %-9s %s (routes on :%d)", r.name, r.nats.ClientURL(), r.clusterPort)
	}
	return b.waitJetStream(ctx)
}

// waitJetStream polls until every server answers JetStream requests and a
// bucket replicated like the nodes' ones can be created.
func (b *Bed) waitJetStream(ctx context.Context) error {
	b.progress("waiting for JetStream to elect its meta leader")
	var urls []string
	for _, r := range b.regions {
		urls = append(urls, r.nats.ClientURL())
	}
	replicas := min(len(b.regions), 3)
	opts, err := shardmap.NATSOptions(b.Layout.NATSAuth, b.Layout.NATSTLS)
	if err != nil {
		return err
	}
	if err := provision.WaitJetStream(ctx, urls, replicas, jetStreamReadyTimeout, opts...); err != nil {
		return err
	}
	b.progress("JetStream ready (R%d)", replicas)
	return nil
}
