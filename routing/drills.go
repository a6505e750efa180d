package routing

import (
	"cmp"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/triage-queue/triage/proto/triage/peer"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

// Drill limits (ReportDrill, ListDrills).
const (
	MaxDrillIDBytes        = 64
	MaxDrillTextBytes      = 1000
	MaxDrillEventsPerCall  = 100
	MaxDrillEventsKept     = 200
	MaxDrillsListed        = 20
	DrillTTL               = 24 * time.Hour
	maxDrillUpdateAttempts = 50
)

// OpenDrills opens (creating it when missing) the KV bucket of drills,
// peer.DrillsBucket, with replicas copies.
func OpenDrills(ctx context.Context, js jetstream.JetStream, replicas int) (jetstream.KeyValue, error) {
	kv, err := peer.EnsureKeyValue(ctx, js, jetstream.KeyValueConfig{
		Bucket: peer.DrillsBucket, TTL: DrillTTL, History: 1, Storage: jetstream.FileStorage, Replicas: max(replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("open kv bucket %s: %w", peer.DrillsBucket, err)
	}
	return kv, nil
}

// drillKey is id's key: hex, since a drill id may hold what a KV key may
// not (a leading '.', "..").
func drillKey(id string) string { return "drill." + hex.EncodeToString([]byte(id)) }

func validDrillID(id string) bool {
	if id == "" || len(id) > MaxDrillIDBytes {
		return false
	}
	for _, c := range []byte(id) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func checkReportDrill(req *triagev1.ReportDrillRequest) error {
	if !validDrillID(req.Id) {
		return invalid("id %q: use 1-%d letters, digits, '.', '_' or '-'", req.Id, MaxDrillIDBytes)
	}
	for what, s := range map[string]string{"scenario": req.Scenario, "phase": req.Phase, "verdict": req.Verdict} {
		if len(s) > MaxDrillTextBytes {
			return invalid("%s is %d bytes: allowed at most %d", what, len(s), MaxDrillTextBytes)
		}
	}
	if len(req.Events) > MaxDrillEventsPerCall {
		return invalid("%d events: allowed at most %d per call", len(req.Events), MaxDrillEventsPerCall)
	}
	for i, e := range req.Events {
		if e == nil {
			return invalid("events[%d] is empty", i)
		}
		if len(e.Text) > MaxDrillTextBytes {
			return invalid("events[%d].text is %d bytes: allowed at most %d", i, len(e.Text), MaxDrillTextBytes)
		}
		if e.At != nil {
			if err := e.At.CheckValid(); err != nil {
				return invalid("events[%d].at: %v", i, err)
			}
		}
	}
	return nil
}

func (r *Router) drills() (jetstream.KeyValue, error) {
	if r.cfg.Drills == nil {
		return nil, errorf(ErrUnavailable, "this router keeps no drills")
	}
	return r.cfg.Drills, nil
}

// ReportDrill implements triagev1.AdminServer: it creates or updates the
// drill in peer.DrillsBucket, appending the request's events, with the
// key's revision as the condition so that concurrent reporters lose no
// event (a conflict reads the drill again and retries).
func (a *Admin) ReportDrill(ctx context.Context, req *triagev1.ReportDrillRequest) (*triagev1.Drill, error) {
	r := a.r
	if err := checkReportDrill(req); err != nil {
		return nil, err
	}
	kv, err := r.drills()
	if err != nil {
		return nil, err
	}
	key := drillKey(req.Id)
	for range maxDrillUpdateAttempts {
		now := r.cfg.Now()
		var (
			d   = &triagev1.Drill{Id: req.Id, StartedAt: timestamppb.New(now)}
			rev uint64
		)
		e, err := kv.Get(ctx, key)
		switch {
		case err == nil:
			if err := proto.Unmarshal(e.Value(), d); err != nil {
				return nil, fmt.Errorf("drill %s: %w", req.Id, err)
			}
			rev = e.Revision()
		case !errors.Is(err, jetstream.ErrKeyNotFound):
			return nil, errorf(ErrUnavailable, "read drill %s: %v", req.Id, err)
		}
		applyDrillReport(d, req, now)
		data, err := proto.Marshal(d)
		if err != nil {
			return nil, err
		}
		if rev == 0 {
			_, err = kv.Create(ctx, key, data)
		} else {
			_, err = kv.Update(ctx, key, data, rev)
		}
		switch {
		case err == nil:
			return d, nil
		case errors.Is(err, jetstream.ErrKeyExists), errors.Is(err, jetstream.ErrKeyRevisionMismatch):
			continue // another reporter wrote in between: read again
		case ctx.Err() != nil:
			return nil, ctx.Err()
		default:
			return nil, errorf(ErrUnavailable, "store drill %s: %v", req.Id, err)
		}
	}
	return nil, errorf(ErrUnavailable, "drill %s: %d concurrent updates in a row; retry", req.Id, maxDrillUpdateAttempts)
}

func applyDrillReport(d *triagev1.Drill, req *triagev1.ReportDrillRequest, now time.Time) {
	d.Scenario = cmp.Or(d.Scenario, req.Scenario)
	d.Phase = cmp.Or(req.Phase, d.Phase)
	d.Verdict = cmp.Or(req.Verdict, d.Verdict)
	d.Done = d.Done || req.Done
	d.UpdatedAt = timestamppb.New(now)
	for _, e := range req.Events {
		at := e.At
		if at == nil {
			at = timestamppb.New(now)
		}
		d.Events = append(d.Events, &triagev1.DrillEvent{At: at, Text: e.Text})
	}
	if n := len(d.Events) - MaxDrillEventsKept; n > 0 {
		d.Events = slices.Delete(d.Events, 0, n)
	}
}

// ListDrills implements triagev1.AdminServer: the drills in
// peer.DrillsBucket, newest first.
func (a *Admin) ListDrills(ctx context.Context, _ *triagev1.ListDrillsRequest) (*triagev1.ListDrillsResponse, error) {
	r := a.r
	kv, err := r.drills()
	if err != nil {
		return nil, err
	}
	// One watcher delivers every drill's latest value, then a nil entry
	// once it has caught up: one consumer for the listing, not a Get per
	// key after listing the keys.
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, errorf(ErrUnavailable, "list drills: %v", err)
	}
	defer func() { _ = w.Stop() }()
	var out []*triagev1.Drill
	for caughtUp := false; !caughtUp; {
		select {
		case e := <-w.Updates():
			if e == nil {
				caughtUp = true
				continue
			}
			d := &triagev1.Drill{}
			if err := proto.Unmarshal(e.Value(), d); err != nil {
				r.log.Warn("unreadable drill skipped", "key", e.Key(), "err", err)
				continue
			}
			out = append(out, d)
		case <-ctx.Done():
			return nil, errorf(ErrUnavailable, "list drills: %v", ctx.Err())
		}
	}
	slices.SortFunc(out, func(a, b *triagev1.Drill) int {
		if c := b.StartedAt.AsTime().Compare(a.StartedAt.AsTime()); c != 0 {
			return c
		}
		return cmp.Compare(b.Id, a.Id)
	})
	if len(out) > MaxDrillsListed {
		out = out[:MaxDrillsListed]
	}
	return &triagev1.ListDrillsResponse{Drills: out}, nil
}
