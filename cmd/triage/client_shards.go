package main

// The shard verbs: add, drain, retire and weigh shards online, and give a
// namespace a shard (see "Growing and shrinking" in the README).

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

func init() {
	clientVerbs["shard add"] = clientVerb{
		args: "ID",
		summary: "Add a shard to the shard map (its schema is migrated first). Namespaces that list no shards\n" +
			"for its home region take it at once, with its --weight; others with `namespace add-shard`.",
		setup: shardAddCmd,
	}
	clientVerbs["shard drain"] = clientVerb{
		args: "ID",
		summary: "Stop new enqueues to a shard; dequeues and item calls go on until it is empty. Its dedup\n" +
			"keys move to the namespace's other shards, which look a key up on it first while it holds it.",
		setup: shardIDCmd(func(ctx context.Context, c triagev1.AdminClient, id uint32) (*triagev1.ShardChange, error) {
			return c.DrainShard(ctx, &triagev1.DrainShardRequest{Shard: id})
		}),
	}
	clientVerbs["shard retire"] = clientVerb{
		args: "ID",
		summary: "Remove a drained shard from the map. Refused (exit 1, saying what is left) until it has\n" +
			"drained for 5 s, its enqueue buffer is empty and it holds no items, dead letters or live tombstones.",
		setup: shardIDCmd(func(ctx context.Context, c triagev1.AdminClient, id uint32) (*triagev1.ShardChange, error) {
			return c.RetireShard(ctx, &triagev1.RetireShardRequest{Shard: id})
		}),
	}
	clientVerbs["shard weight"] = clientVerb{
		args:    "ID WEIGHT",
		summary: "Set a shard's share of new enqueues among its namespaces' shards in its region (1 to 1000).",
		setup:   shardWeightCmd,
	}
	clientVerbs["namespace add-shard"] = clientVerb{
		args:    "NAME SHARD",
		summary: "Add a shard to a namespace's shards in the shard's home region (--region, required).",
		setup:   namespaceAddShardCmd,
	}
}

func parseShardID(s string) (uint32, error) {
	id, err := strconv.ParseUint(s, 10, 32)
	if err != nil || id == 0 {
		return 0, usagef("shard %q: want a positive number", s)
	}
	return uint32(id), nil
}

func printChange(e *clientEnv, what string, id uint32, c *triagev1.ShardChange) error {
	if e.json {
		return printJSON(e.stdout, c)
	}
	s := c.GetShard()
	if s == nil {
		fmt.Fprintf(e.stdout, "shard %d %s (map version %d)\n", id, what, c.GetVersion())
		return nil
	}
	state := "active"
	if s.GetDraining() {
		state = "draining since " + formatTime(s.GetDrainedAt())
	}
	fmt.Fprintf(e.stdout, "shard %d %s (map version %d): home %s, primary %s, weight %d, %s\n",
		id, what, c.GetVersion(), s.GetHomeRegion(), s.GetPrimary(), s.GetWeight(), state)
	return nil
}

func shardAddCmd(fs *pflag.FlagSet) clientRun {
	home := fs.String("home", "", "home region (required)")
	primary := fs.String("primary", "", "the primary's host:port (required)")
	database := fs.String("database", "", "schema name on the primary (default triage)")
	replicas := fs.StringSlice("replica", nil, "a replica as host:port@region, in promotion order (repeatable)")
	weight := fs.Uint32("weight", 0, "share of new enqueues, 1 to 1000 (default 1)")
	return func(ctx context.Context, e *clientEnv, args []string) error {
		id, err := parseShardID(args[0])
		if err != nil {
			return err
		}
		if *home == "" || *primary == "" {
			return usagef("give --home REGION and --primary HOST:PORT")
		}
		s := &triagev1.Shard{Id: id, HomeRegion: *home, Primary: *primary, Database: *database, Weight: *weight}
		for _, r := range *replicas {
			addr, region, ok := strings.Cut(r, "@")
			if !ok || addr == "" || region == "" {
				return usagef("--replica %q: want host:port@region", r)
			}
			s.Replicas = append(s.Replicas, addr)
			s.ReplicaRegions = append(s.ReplicaRegions, region)
		}
		rctx, cancel := e.rpc(ctx, 0)
		defer cancel()
		c, err := e.c.Admin.AddShard(rctx, &triagev1.AddShardRequest{Shard: s})
		if err != nil {
			return err
		}
		return printChange(e, "added", id, c)
	}
}

func shardIDCmd(call func(context.Context, triagev1.AdminClient, uint32) (*triagev1.ShardChange, error)) func(*pflag.FlagSet) clientRun {
	return func(*pflag.FlagSet) clientRun {
		return func(ctx context.Context, e *clientEnv, args []string) error {
			id, err := parseShardID(args[0])
			if err != nil {
				return err
			}
			rctx, cancel := e.rpc(ctx, 0)
			defer cancel()
			c, err := call(rctx, e.c.Admin, id)
			if err != nil {
				return err
			}
			what := "draining"
			if c.GetShard() == nil {
				what = "retired"
			}
			return printChange(e, what, id, c)
		}
	}
}

func shardWeightCmd(*pflag.FlagSet) clientRun {
	return func(ctx context.Context, e *clientEnv, args []string) error {
		id, err := parseShardID(args[0])
		if err != nil {
			return err
		}
		w, err := strconv.ParseUint(args[1], 10, 32)
		if err != nil || w < 1 || w > 1000 {
			return usagef("weight %q: allowed 1 to 1000", args[1])
		}
		rctx, cancel := e.rpc(ctx, 0)
		defer cancel()
		c, err := e.c.Admin.SetShardWeight(rctx, &triagev1.SetShardWeightRequest{Shard: id, Weight: uint32(w)})
		if err != nil {
			return err
		}
		return printChange(e, "weighed", id, c)
	}
}

func namespaceAddShardCmd(*pflag.FlagSet) clientRun {
	return func(ctx context.Context, e *clientEnv, args []string) error {
		id, err := parseShardID(args[1])
		if err != nil {
			return err
		}
		if e.region == "" {
			return usagef("give --region: the shard's home region")
		}
		rctx, cancel := e.rpc(ctx, 0)
		defer cancel()
		c, err := e.c.Admin.AddNamespaceShard(rctx, &triagev1.AddNamespaceShardRequest{Namespace: args[0], Region: e.region, Shard: id})
		if err != nil {
			return err
		}
		return printChange(e, "added to namespace "+args[0], id, c)
	}
}
