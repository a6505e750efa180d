package scale

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

// Bounds of issue 40's done-when, which Check applies at every size.
const (
	// MapChangeLimitMs: a shard-map change is served by every process.
	MapChangeLimitMs = 2000
	// TakeoverLimitSeconds: a dead dequeuer's shards are all owned again.
	TakeoverLimitSeconds = 10
	// IdleCPULimitPercent: an idle node's share of one core.
	IdleCPULimitPercent = 10
	// FailoverRTOLimitSeconds: the failover drill's enqueues and dequeues
	// on the killed server's shards are served again (Config.Failover).
	// The failover itself takes a second or two; an RTO near the drill's
	// hold means the new primary's commits waited for a semi-sync replica
	// until the killed server rejoined.
	FailoverRTOLimitSeconds = 10
)

// rto is the check of a failover RTO of ms milliseconds: under
// FailoverRTOLimitSeconds, and not -1 (never served again).
func rto(name string, ms int64) Check {
	v := float64(ms) / 1000
	return Check{Name: name, Limit: FailoverRTOLimitSeconds, Value: v, OK: ms >= 0 && v < FailoverRTOLimitSeconds}
}

func check(rec *Record) []Check {
	bound := func(name string, limit, value float64) Check {
		return Check{Name: name, Limit: limit, Value: value, OK: value <= limit}
	}
	cs := []Check{
		bound("namespace change served by every node (ms, slowest trial)", MapChangeLimitMs, slices.Max(rec.NamespaceChangeMs)),
		bound("shard add served by every node (ms)", MapChangeLimitMs, rec.AddShardMs),
		bound("dead dequeuer's shards owned again (s)", TakeoverLimitSeconds, rec.Takeover.Seconds),
		bound("shards the busiest dequeuer owned beyond an even split", 0, float64(rec.Takeover.Excess)),
		bound("acknowledged load items not delivered within 25 s of its end", 0, float64(rec.Load.Missing)),
	}
	if f := rec.Failover; f != nil {
		cs = append(cs,
			bound(fmt.Sprintf("shards of the killed server not moved to one new primary (of %d)", f.Shards), 0, float64(f.Shards-f.Moved)),
			bound("acknowledged items lost in the failover drill", 0, float64(f.Lost)),
			bound("nacks and acks undone in the failover drill", 0, float64(f.NacksUndone+f.AcksUndone)),
			rto("enqueue RTO of the failover drill (s; -1: never served)", f.EnqueueRTOMs),
			rto("dequeue RTO of the failover drill (s; -1: never served)", f.DequeueRTOMs),
			bound(fmt.Sprintf("other replicas of shard %d not following its new primary after the failover drill (of %d)", failoverShard, len(f.Others)),
				0, float64(len(f.Others)-f.Following)))
	}
	for _, u := range rec.Idle {
		if strings.HasPrefix(u.Name, "mariadbd") || u.Name == "nats+bed" {
			continue
		}
		cs = append(cs, bound("idle CPU of "+u.Name+" (% of a core)", IdleCPULimitPercent, u.CPUPercent))
	}
	return cs
}

// Failed lists the checks rec did not pass.
func (rec *Record) Failed() []Check {
	var bad []Check
	for _, c := range rec.Checks {
		if !c.OK {
			bad = append(bad, c)
		}
	}
	return bad
}

// File is .triage/scale.json: one record per size, and per size one of a
// bed with Config.Failover, the latest run of each.
type File struct {
	Records []Record `json:"records"`
}

// Save puts rec into the file at path, replacing a record of the same
// number of shards and the same kind (with a failover step or without).
func Save(path string, rec Record) error {
	var f File
	if data, err := os.ReadFile(path); err == nil {
		_ = json.Unmarshal(data, &f)
	}
	kind := func(r Record) bool { return r.Failover != nil }
	f.Records = slices.DeleteFunc(f.Records, func(r Record) bool { return r.Shards == rec.Shards && kind(r) == kind(rec) })
	f.Records = append(f.Records, rec)
	slices.SortStableFunc(f.Records, func(a, b Record) int {
		return cmp.Or(cmp.Compare(a.Shards, b.Shards), cmp.Compare(ord(kind(a)), ord(kind(b))))
	})
	data, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}

// ord orders false before true.
func ord(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Print writes rec as a few lines for a person.
func (rec *Record) Print(w io.Writer) {
	fmt.Fprintf(w, "%d shards on %d servers, %d namespaces, %d topics (up in %.0f s)\n", rec.Shards, rec.Servers, rec.Namespaces, rec.Topics, rec.BringUpSeconds)
	fmt.Fprintf(w, "  shard map %d bytes (head %d), load %.1f ms; namespace change %v ms; shard add %.1f ms\n", rec.MapBytes, rec.HeadBytes, rec.MapLoadMs, rec.NamespaceChangeMs, rec.AddShardMs)
	fmt.Fprint(w, "  idle:")
	for _, u := range rec.Idle {
		fmt.Fprintf(w, " %s %.1f%% %.0f MiB;", u.Name, u.CPUPercent, u.RSSMiB)
	}
	l := rec.Load
	fmt.Fprintf(w, "\n  load %.0f/s, %.0f s measured after %.0f s: %d enqueued, %d delivered from %d shards, %d acknowledged not delivered, %d errors; enqueue p50/p99 %.1f/%.1f ms, end-to-end p50/p99 %.1f/%.1f ms, ack p99 %.1f ms\n",
		l.OfferedPerSec, l.Seconds, l.WarmSeconds, l.Enqueued, l.Delivered, l.ShardsHit, l.Missing, l.Errors, l.EnqueueP50Ms, l.EnqueueP99Ms, l.EndToEndP50Ms, l.EndToEndP99Ms, l.AckP99Ms)
	fmt.Fprint(w, "  during the load:")
	for _, u := range l.CPU {
		fmt.Fprintf(w, " %s %.0f%%;", u.Name, u.CPUPercent)
	}
	for i, st := range l.Statements {
		fmt.Fprintf(w, "\n  mariadbd-%d statements/s during the load: %v", i+1, st)
	}
	fmt.Fprint(w, "\n  /metrics:")
	for _, s := range rec.Scrapes {
		fmt.Fprintf(w, " %s %d B %.0f ms;", s.Name, s.Bytes, s.Ms)
	}
	fmt.Fprintf(w, "\n  takeover: %s held %d shards, all owned again in %.2f s\n", rec.Takeover.Killed, rec.Takeover.Shards, rec.Takeover.Seconds)
	if f := rec.Failover; f != nil {
		fmt.Fprintf(w, "  failover: killed %s, primary of %d shards; %d moved to %s (%d new primaries), the last published %.2f s after the kill\n",
			f.Server, f.Shards, f.Moved, f.NewPrimary, f.NewPrimaries, f.Seconds)
		fmt.Fprintf(w, "    drill: %d acknowledged, %d lost, %d nacks and %d acks undone, %d early; RTO enqueue %d ms, dequeue %d ms; old primary %s\n",
			f.Acknowledged, f.Lost, f.NacksUndone, f.AcksUndone, f.Early, f.EnqueueRTOMs, f.DequeueRTOMs, f.OldPrimary)
		fmt.Fprintf(w, "    after: new primary in %s with %d semi-sync replicas connected; %d of %d other replicas follow it: %s\n",
			f.NewRegion, f.SemiSyncClients, f.Following, len(f.Others), strings.Join(f.Others, "; "))
		for _, v := range f.Violations {
			fmt.Fprintf(w, "    violation: %s\n", v)
		}
	}
	for _, c := range rec.Checks {
		mark := "ok    "
		if !c.OK {
			mark = "FAILED"
		}
		fmt.Fprintf(w, "  %s %s: %.1f (limit %.0f)\n", mark, c.Name, c.Value, c.Limit)
	}
}
