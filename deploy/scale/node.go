package scale

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/triage-queue/triage/cmd/triage/node"
	"github.com/triage-queue/triage/cmd/triage/provision"
	"github.com/triage-queue/triage/deploy/freeport"
	"github.com/triage-queue/triage/shardmap"
)

// Node is one `triage serve` process of the bed.
type Node struct {
	// Name is unique in the bed ("router", "dequeuer-1", ...); Role is the
	// node's one role, Region its region (Region but for the
	// controllers of the replica regions).
	Name, Role, Region string
	// Metrics is the metrics listener (host:port), GRPC the router's,
	// Pprof the net/http/pprof listener.
	Metrics, GRPC, Pprof string
	// DequeuerID is a dequeuer's ID in the ownership bucket.
	DequeuerID string
	cmd        *exec.Cmd
	done       chan struct{}
}

// readyWithin bounds a node's start: at a thousand shards it loads the
// map and checks every shard's schema before it is ready.
const readyWithin = 3 * time.Minute

// startNodes starts the router alone (the first node creates the KV
// buckets and stores the map), then the other roles at once: with
// Failover, a controller in each replica region too, and every
// controller gets the replication account.
func (b *Bed) startNodes(ctx context.Context) error {
	b.progress("starting the router")
	router, err := b.startNode(ctx, "router", node.RoleRouter)
	if err != nil {
		return err
	}
	b.Nodes = append(b.Nodes, router)
	rest := []*Node{{Name: "enqueuer", Role: node.RoleEnqueuer}, {Name: "controller", Role: node.RoleController}}
	for i := range b.cfg.Dequeuers {
		name := fmt.Sprintf("dequeuer-%d", i+1)
		rest = append(rest, &Node{Name: name, Role: node.RoleDequeuer, DequeuerID: Region + "-" + name})
	}
	var repl shardmap.Account
	if b.cfg.Failover {
		for _, region := range replicaRegions {
			rest = append(rest, &Node{Name: "controller-" + region, Role: node.RoleController, Region: region})
		}
		if repl, err = b.replAccount(); err != nil {
			return err
		}
	}
	b.progress("starting %d more nodes (enqueuer, %d controllers, %d dequeuers)", len(rest), len(rest)-1-b.cfg.Dequeuers, b.cfg.Dequeuers)
	started := make([]*Node, len(rest))
	err = provision.Parallel(len(rest), func(i int) error {
		n, err := b.startNode(ctx, rest[i].Name, rest[i].Role, func(c *node.Config) {
			c.DequeuerID = rest[i].DequeuerID
			c.Region = cmp.Or(rest[i].Region, Region)
			if c.Roles[0] == node.RoleController {
				c.Replication = repl
			}
		})
		started[i] = n
		return err
	})
	for _, n := range started {
		if n != nil {
			b.Nodes = append(b.Nodes, n)
		}
	}
	return err
}

// startNode runs `triage serve` with one role and waits for /readyz.
func (b *Bed) startNode(ctx context.Context, name, role string, opts ...func(*node.Config)) (*Node, error) {
	metrics, err := freeport.Addr()
	if err != nil {
		return nil, err
	}
	pprof, err := freeport.Addr()
	if err != nil {
		return nil, err
	}
	cfg := node.Config{Region: Region, Roles: []string{role}, NATS: b.NATSURL(), Metrics: metrics, Pprof: pprof,
		MySQL:        shardmap.Credentials{User: provision.BedAccounts.App.User, Password: provision.BedAccounts.App.Password},
		Admin:        shardmap.Credentials{User: "root"},
		ShardMapFile: b.mapFile, OwnerTTL: shardmap.Duration(b.cfg.OwnerTTL)}
	n := &Node{Name: name, Role: role, Metrics: metrics, Pprof: pprof, done: make(chan struct{})}
	if role == node.RoleRouter {
		if cfg.GRPC, err = freeport.Addr(); err != nil {
			return nil, err
		}
		if cfg.HTTP, err = freeport.Addr(); err != nil {
			return nil, err
		}
		n.GRPC = cfg.GRPC
	}
	for _, o := range opts {
		o(&cfg)
	}
	n.DequeuerID, n.Region = cfg.DequeuerID, cfg.Region
	data, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	file := filepath.Join(b.cfg.Dir, name+".json")
	if err := os.WriteFile(file, data, 0o600); err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(b.cfg.Dir, name+".log"))
	if err != nil {
		return nil, err
	}
	n.cmd = exec.Command(b.cfg.Triage, "serve", "--config", file, "--log-level", "warn")
	n.cmd.Stdout, n.cmd.Stderr = logf, logf
	// A bed process that dies takes its nodes along.
	n.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := n.cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	go func() {
		_ = n.cmd.Wait()
		logf.Close()
		close(n.done)
	}()
	if err := n.waitReady(ctx); err != nil {
		n.Stop()
		return nil, fmt.Errorf("%s (log %s): %w", name, logf.Name(), err)
	}
	b.progress("  %s ready (pid %d)", name, n.PID())
	return n, nil
}

func (n *Node) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, readyWithin)
	defer cancel()
	return provision.Poll(ctx, 100*time.Millisecond, func(ctx context.Context) error {
		select {
		case <-n.done:
			return fmt.Errorf("exited: %s", n.cmd.ProcessState)
		default:
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+n.Metrics+"/readyz", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("readyz: %s", resp.Status)
		}
		return nil
	})
}

// PID is the node's process ID.
func (n *Node) PID() int { return n.cmd.Process.Pid }

// Kill sends SIGKILL and waits for the process to end.
func (n *Node) Kill() {
	_ = n.cmd.Process.Signal(syscall.SIGKILL)
	<-n.done
}

// Stop sends SIGTERM and waits; SIGKILL after 20 s.
func (n *Node) Stop() {
	select {
	case <-n.done:
		return
	default:
	}
	_ = n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.done:
	case <-time.After(20 * time.Second):
		n.Kill()
	}
}
