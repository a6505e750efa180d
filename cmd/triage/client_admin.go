package main

// The operator's verbs: dead letters (deadletters, redrive,
// delete-deadletters), topics (pause, resume) and namespace configuration
// (namespace get, put, patch).

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/routing"
)

// maxDeadLetterPage is the largest page_size the router accepts for
// ListDeadLetters.
const maxDeadLetterPage = 1000

const namespacePutSummary = `Create or replace a namespace's configuration and print the result.
The whole configuration is replaced: what neither --file nor a flag gives takes its default.
To change some settings and keep the rest, use namespace patch, or start from the current ones:
  triage namespace get NAME --json > ns.json
  triage namespace put NAME --file ns.json --max-attempts 5
Flags override the file: --shards replaces the file's entry for its region, --topic the
file's entry for its topic, and NAME the file's name. Shards and quotas (--shards,
--max-payload-bytes, --rate, --burst, --max-depth) are cluster-admin's: a namespace admin's
put that would change one, by leaving it out too, is refused and changes nothing.`

const namespacePatchSummary = `Change the settings the flags give and print the result; every other setting stays
as it is (an update_mask of exactly those settings: HTTP PATCH). --topic sets one topic's
config and --remove-topic removes one; other topics stay. Shards are changed with namespace
put or namespace add-shard. Quotas (--max-payload-bytes, --rate, --burst, --max-depth) need
cluster-admin.`

func deadLettersCmd(fs *pflag.FlagSet) clientRun {
	pageSize := fs.Int("page-size", 0, fmt.Sprintf("dead letters per page, 1 to %d (default: the server's, 100)", maxDeadLetterPage))
	pageToken := fs.String("page-token", "", "start at the next_page_token of an earlier page")
	all := fs.Bool("all", false, "follow next_page_token to the last page")
	return func(ctx context.Context, e *clientEnv, args []string) error {
		if *pageSize < 0 || *pageSize > maxDeadLetterPage {
			return usagef("--page-size %d: allowed 1 to %d", *pageSize, maxDeadLetterPage)
		}
		out := &triagev1.ListDeadLettersResponse{}
		// A token seen twice would loop forever, so it ends the walk.
		seen := map[string]bool{}
		for token := *pageToken; ; {
			rctx, cancel := e.rpc(ctx, 0)
			resp, err := e.c.Queue.ListDeadLetters(rctx, &triagev1.ListDeadLettersRequest{
				Namespace: e.ns, Topic: args[0], Region: e.region, PageSize: int32(*pageSize), PageToken: token,
			})
			cancel()
			if err != nil {
				return err
			}
			out.DeadLetters = append(out.DeadLetters, resp.GetDeadLetters()...)
			token = resp.GetNextPageToken()
			out.NextPageToken = token
			if !*all || token == "" || seen[token] {
				break
			}
			seen[token] = true
		}
		if *all {
			out.NextPageToken = ""
		}
		if e.json {
			return printJSON(e.stdout, out)
		}
		if len(out.GetDeadLetters()) == 0 {
			fmt.Fprintln(e.stderr, "no dead letters")
		} else {
			tw := newTable(e.stdout)
			fmt.Fprintln(tw, "ID\tPRIORITY\tATTEMPTS\tDIED AT\tLAST ERROR\tPAYLOAD")
			for _, d := range out.GetDeadLetters() {
				fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\n", d.GetId(), d.GetPriority(), d.GetAttempts(),
					formatTime(d.GetDiedAt()), orDash(cellText(d.GetLastError())), payloadText(d.GetPayload()))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
		}
		if out.NextPageToken != "" {
			fmt.Fprintf(e.stderr, "more dead letters: --page-token %s, or --all\n", out.NextPageToken)
		}
		return nil
	}
}

func redriveCmd(_ *pflag.FlagSet) clientRun {
	return func(ctx context.Context, e *clientEnv, args []string) error {
		if len(args) == 0 {
			return usagef("missing TOPIC")
		}
		topic, ids := args[0], uniq(args[1:])
		total := &triagev1.RedriveDeadLettersResponse{}
		send := func(chunk []string) error {
			rctx, cancel := e.rpc(ctx, 0)
			defer cancel()
			resp, err := e.c.Queue.RedriveDeadLetters(rctx, &triagev1.RedriveDeadLettersRequest{
				Namespace: e.ns, Topic: topic, Region: e.region, Ids: chunk,
			})
			if err != nil {
				if total.Redriven > 0 {
					fmt.Fprintf(e.stderr, "triage: %d redriven before the error\n", total.Redriven)
				}
				return err
			}
			total.Redriven += resp.GetRedriven()
			return nil
		}
		if err := perChunk(ids, len(ids) == 0, send); err != nil {
			return err
		}
		if err := e.printCount(total, "redriven", total.Redriven); err != nil {
			return err
		}
		if len(ids) > 0 && total.Redriven < int64(len(ids)) {
			fmt.Fprintf(e.stderr, "triage: %d of %d not redriven: not dead letters of %s, or a live item holds their dedup key\n",
				int64(len(ids))-total.Redriven, len(ids), topic)
			return errItemsFailed
		}
		return nil
	}
}

func deleteDeadLettersCmd(fs *pflag.FlagSet) clientRun {
	all := fs.Bool("all", false, "delete every dead letter of TOPIC (instead of listing IDs)")
	before := fs.String("before", "", "only dead letters that died before this `RFC3339` time")
	olderThan := fs.Duration("older-than", 0, "only dead letters that died longer ago than this (instead of --before)")
	return func(ctx context.Context, e *clientEnv, args []string) error {
		if len(args) == 0 {
			return usagef("missing TOPIC")
		}
		topic, ids := args[0], uniq(args[1:])
		req := &triagev1.DeleteDeadLettersRequest{Namespace: e.ns, Topic: topic, Region: e.region, All: *all}
		switch {
		case *all && len(ids) > 0:
			return usagef("give dead letter IDs or --all, not both")
		case !*all && len(ids) == 0:
			return usagef("nothing to delete: give dead letter IDs, or --all for every one of %s's", topic)
		case *before != "" && *olderThan != 0:
			return usagef("give --before or --older-than, not both")
		case *before != "":
			t, err := time.Parse(time.RFC3339, *before)
			if err != nil {
				return usagef("--before %q is not an RFC3339 time like YYYY-MM-DDThh:mm:ssZ", *before)
			}
			req.Before = timestamppb.New(t)
		case *olderThan < 0:
			return usagef("--older-than %s: give a positive duration", *olderThan)
		case *olderThan > 0:
			req.Before = timestamppb.New(time.Now().Add(-*olderThan))
		}
		total := &triagev1.DeleteDeadLettersResponse{}
		send := func(chunk []string) error {
			req.Ids = chunk
			resp, err := call(ctx, e, e.c.Queue.DeleteDeadLetters, req)
			if err != nil {
				if total.Deleted > 0 {
					fmt.Fprintf(e.stderr, "triage: %d deleted before the error\n", total.Deleted)
				}
				return err
			}
			total.Deleted += resp.GetDeleted()
			return nil
		}
		if err := perChunk(ids, *all, send); err != nil {
			return err
		}
		if err := e.printCount(total, "deleted", total.Deleted); err != nil {
			return err
		}
		if len(ids) > 0 && total.Deleted < int64(len(ids)) {
			fmt.Fprintf(e.stderr, "triage: %d of %d not deleted: not dead letters of %s (already deleted or redriven), or died after --before\n",
				int64(len(ids))-total.Deleted, len(ids), topic)
			return errItemsFailed
		}
		return nil
	}
}

// uniq is ids without repeats, in their first order: an ID listed twice
// is acted on once, so it must count once when the result is checked
// against the IDs asked for.
func uniq(ids []string) []string {
	var out []string
	for _, id := range ids {
		if !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	return out
}

// pauseCmd is pause (paused true) or resume.
func pauseCmd(paused bool) func(*pflag.FlagSet) clientRun {
	return func(_ *pflag.FlagSet) clientRun {
		return func(ctx context.Context, e *clientEnv, args []string) error {
			var st *triagev1.TopicPauseState
			var err error
			if paused {
				st, err = call(ctx, e, e.c.Admin.PauseTopic, &triagev1.PauseTopicRequest{Namespace: e.ns, Topic: args[0]})
			} else {
				st, err = call(ctx, e, e.c.Admin.ResumeTopic, &triagev1.ResumeTopicRequest{Namespace: e.ns, Topic: args[0]})
			}
			if err != nil {
				return err
			}
			if e.json {
				return printJSON(e.stdout, st)
			}
			state := "resumed"
			if st.GetPaused() {
				state = "paused"
			}
			_, err = fmt.Fprintf(e.stdout, "%s  %s (shard map version %d)\n", st.GetTopic(), state, st.GetVersion())
			return err
		}
	}
}

func namespaceGetCmd(_ *pflag.FlagSet) clientRun {
	return func(ctx context.Context, e *clientEnv, args []string) error {
		ns, err := call(ctx, e, e.c.Admin.GetNamespace, &triagev1.GetNamespaceRequest{Namespace: args[0]})
		if err != nil {
			return err
		}
		return printNamespace(e, ns)
	}
}

func namespacePutCmd(fs *pflag.FlagSet) clientRun {
	file := fs.String("file", "", "start from the JSON Namespace document in `FILE` (protojson, as namespace get --json prints it); - reads stdin")
	flags := newNamespaceFlags(fs, false)
	return func(ctx context.Context, e *clientEnv, args []string) error {
		name := args[0]
		cfg := &triagev1.Namespace{}
		if *file != "" {
			var err error
			if cfg, err = readNamespaceFile(*file, e.stdin); err != nil {
				return err
			}
		}
		if _, err := flags.apply(cfg, name); err != nil {
			return err
		}
		ns, err := call(ctx, e, e.c.Admin.PutNamespace, &triagev1.PutNamespaceRequest{Namespace: name, Config: cfg})
		if err != nil {
			return err
		}
		return printNamespace(e, ns)
	}
}

func namespacePatchCmd(fs *pflag.FlagSet) clientRun {
	flags := newNamespaceFlags(fs, true)
	return func(ctx context.Context, e *clientEnv, args []string) error {
		name := args[0]
		cfg := &triagev1.Namespace{}
		paths, err := flags.apply(cfg, name)
		if err != nil {
			return err
		}
		if len(paths) == 0 {
			return usagef("namespace patch %s: no setting given; name at least one flag", name)
		}
		ns, err := call(ctx, e, e.c.Admin.PutNamespace, &triagev1.PutNamespaceRequest{Namespace: name, Config: cfg,
			UpdateMask: &fieldmaskpb.FieldMask{Paths: paths}})
		if err != nil {
			return err
		}
		return printNamespace(e, ns)
	}
}

// namespaceFlags are the settings flags of namespace put and patch, one
// per Namespace field.
type namespaceFlags struct {
	fs          *pflag.FlagSet
	maxPayload  *int
	lease       *time.Duration
	maxAttempts *int
	ttl         *time.Duration
	rate        *float64
	burst       *int
	maxDepth    *int64
	dedupWindow *time.Duration
	retryWindow *time.Duration
	shards      *shardsFlag // put only
	topics      *topicsFlag
	remove      *[]string // patch only
}

func newNamespaceFlags(fs *pflag.FlagSet, patch bool) *namespaceFlags {
	f := &namespaceFlags{
		fs:          fs,
		maxPayload:  fs.Int("max-payload-bytes", 0, "largest payload of one item (default 262144; cluster-admin)"),
		lease:       fs.Duration("default-lease", 0, "lease a dequeue takes when neither the item nor the dequeue says (default 30s)"),
		maxAttempts: fs.Int("max-attempts", 0, "deliveries before an item is dead-lettered (default 10)"),
		ttl:         fs.Duration("default-ttl", 0, "delete items this long after enqueue (default: never)"),
		rate:        fs.Float64("rate", 0, "items per second each router accepts for the namespace; 0 for no limit (cluster-admin)"),
		burst:       fs.Int("burst", 0, "items accepted at once above --rate (default: one second of the rate; cluster-admin)"),
		maxDepth:    fs.Int64("max-depth", 0, "items a region's shards may hold for the namespace; 0 for no limit (cluster-admin)"),
		dedupWindow: fs.Duration("dedup-window", 0, "a dedup key stays taken this long after its item is gone (default 0s)"),
		retryWindow: fs.Duration("dedup-retry-window", 0, "a dedup key stays taken this long after its item's enqueue, so retries yield one item (default 5m; 0s: off)"),
		topics:      &topicsFlag{},
	}
	fs.Var(f.topics, "topic", "a topic's dequeue policy, delivery and aging; `SPEC` is "+topicSyntax+" (repeatable)")
	if patch {
		f.remove = fs.StringSlice("remove-topic", nil, "remove a topic's config, so it takes the defaults (`NAME`, repeatable)")
	} else {
		f.shards = &shardsFlag{}
		fs.Var(f.shards, "shards", "the namespace's shards in a region, as `REGION=ID,ID...` (repeatable; a region left out uses all of its; cluster-admin)")
	}
	return f
}

// apply sets cfg's fields from the flags given (NAME as its name) and
// returns the update_mask paths they name.
func (f *namespaceFlags) apply(cfg *triagev1.Namespace, name string) ([]string, error) {
	// The server refuses a body whose name differs from NAME; NAME wins
	// so one namespace's document can seed another.
	cfg.Name = name
	set := flagsSet(f.fs)
	var paths []string
	for _, x := range []struct {
		flag, path string
		v          int
		dst        *int32
	}{
		{"max-payload-bytes", "max_payload_bytes", *f.maxPayload, &cfg.MaxPayloadBytes},
		{"max-attempts", "max_attempts", *f.maxAttempts, &cfg.MaxAttempts},
		{"burst", "enqueue_burst", *f.burst, &cfg.EnqueueBurst},
	} {
		if set[x.flag] {
			v, err := checkInt32(x.flag, x.v)
			if err != nil {
				return nil, err
			}
			*x.dst, paths = v, append(paths, x.path)
		}
	}
	for _, x := range []struct {
		flag, path string
		v          time.Duration
		dst        **durationpb.Duration
	}{
		{"default-lease", "default_lease_duration", *f.lease, &cfg.DefaultLeaseDuration},
		{"default-ttl", "default_ttl", *f.ttl, &cfg.DefaultTtl},
		{"dedup-window", "dedup_window", *f.dedupWindow, &cfg.DedupWindow},
		{"dedup-retry-window", "dedup_retry_window", *f.retryWindow, &cfg.DedupRetryWindow},
	} {
		if set[x.flag] {
			*x.dst, paths = durationpb.New(x.v), append(paths, x.path)
		}
	}
	if set["rate"] {
		// The server's "not negative" check lets NaN through.
		if math.IsNaN(*f.rate) || math.IsInf(*f.rate, 0) {
			return nil, usagef("--rate %v is not a number of items per second", *f.rate)
		}
		cfg.EnqueueRateLimit, paths = *f.rate, append(paths, "enqueue_rate_limit")
	}
	if set["max-depth"] {
		cfg.MaxDepth, paths = *f.maxDepth, append(paths, "max_depth")
	}
	if f.shards != nil {
		for _, s := range f.shards.list {
			i := slices.IndexFunc(cfg.Shards, func(x *triagev1.NamespaceShards) bool { return x.GetRegion() == s.Region })
			if i >= 0 {
				cfg.Shards[i] = s
			} else {
				cfg.Shards = append(cfg.Shards, s)
			}
		}
		for _, s := range cfg.Shards {
			if s != nil {
				s.Namespace = name
			}
		}
	}
	for _, t := range f.topics.list {
		if cfg.Topics == nil {
			cfg.Topics = map[string]*triagev1.TopicConfig{}
		}
		cfg.Topics[t.name], paths = t.cfg, append(paths, "topics."+t.name)
	}
	if f.remove != nil {
		for _, t := range *f.remove {
			if _, both := cfg.Topics[t]; both {
				return nil, usagef("topic %q is both set (--topic) and removed (--remove-topic)", t)
			}
			paths = append(paths, "topics."+t)
		}
	}
	return paths, nil
}

// readNamespaceFile reads a protojson Namespace document from path, or
// from stdin for "-". Unknown fields are errors, so a misspelt key does not
// quietly fall back to its default.
func readNamespaceFile(path string, stdin io.Reader) (*triagev1.Namespace, error) {
	var data []byte
	var err error
	if path == "-" {
		data, err = io.ReadAll(stdin)
	} else {
		data, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, fmt.Errorf("--file: %w", err)
	}
	cfg := &triagev1.Namespace{}
	if err := protojson.Unmarshal(data, cfg); err != nil {
		return nil, fmt.Errorf("--file %s: not a Namespace document: %w", path, err)
	}
	return cfg, nil
}

// shardsFlag collects repeated --shards REGION=ID,ID... flags.
type shardsFlag struct {
	list []*triagev1.NamespaceShards
}

func (f *shardsFlag) String() string {
	if f == nil {
		return ""
	}
	var out []string
	for _, s := range f.list {
		out = append(out, s.GetRegion()+"="+joinShardIDs(s.GetShards()))
	}
	return strings.Join(out, " ")
}

// Type names the value in usage lines that give no `name` of their own.
func (f *shardsFlag) Type() string { return "REGION=ID,ID..." }

func (f *shardsFlag) Set(s string) error {
	region, list, ok := strings.Cut(s, "=")
	if !ok || region == "" || list == "" {
		return fmt.Errorf("%q is not REGION=ID or REGION=ID,ID", s)
	}
	if slices.ContainsFunc(f.list, func(n *triagev1.NamespaceShards) bool { return n.GetRegion() == region }) {
		return fmt.Errorf("region %q given twice", region)
	}
	ns := &triagev1.NamespaceShards{Region: region}
	for p := range strings.SplitSeq(list, ",") {
		id, err := strconv.ParseUint(strings.TrimSpace(p), 10, 32)
		if err != nil {
			return fmt.Errorf("%q: shard ID %q is not a number", s, p)
		}
		ns.Shards = append(ns.Shards, uint32(id))
	}
	f.list = append(f.list, ns)
	return nil
}

func joinShardIDs(ids []uint32) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = strconv.FormatUint(uint64(id), 10)
	}
	return strings.Join(s, ",")
}

// topicsFlag collects repeated --topic flags, in order.
type topicsFlag struct {
	list []namedTopic
}

type namedTopic struct {
	name string
	cfg  *triagev1.TopicConfig
}

// topicSyntax is what --topic takes; errors repeat it.
const topicSyntax = "NAME:policy=weighted|strict[,weights=8/4/2/1/0.5][,at-most-once][,aging=30s]" +
	"[,max-attempts=5][,backoff=exp/1s/15m|fixed/30s][,jitter=0.5]"

func (f *topicsFlag) String() string {
	if f == nil {
		return ""
	}
	var names []string
	for _, t := range f.list {
		names = append(names, t.name)
	}
	return strings.Join(names, ",")
}

// Type names the value in usage lines that give no `name` of their own.
func (f *topicsFlag) Type() string { return "SPEC" }

func (f *topicsFlag) Set(s string) error {
	name, cfg, err := parseTopicSpec(s)
	if err != nil {
		return err
	}
	if slices.ContainsFunc(f.list, func(t namedTopic) bool { return t.name == name }) {
		return fmt.Errorf("topic %q given twice", name)
	}
	f.list = append(f.list, namedTopic{name, cfg})
	return nil
}

// parseTopicSpec parses one --topic value. Topic names hold no ':', so the
// first one ends the name. Every option is optional: "NAME:" alone (or
// "NAME") sets the topic back to the defaults, strict and no aging.
func parseTopicSpec(s string) (string, *triagev1.TopicConfig, error) {
	name, opts, _ := strings.Cut(s, ":")
	if name == "" {
		return "", nil, fmt.Errorf("%q: want %s", s, topicSyntax)
	}
	tc := &triagev1.TopicConfig{}
	seen := map[string]bool{}
	hasWeights := false
	if opts != "" {
		for opt := range strings.SplitSeq(opts, ",") {
			key, val, hasVal := strings.Cut(opt, "=")
			if seen[key] {
				return "", nil, fmt.Errorf("%q: %s given twice", s, key)
			}
			seen[key] = true
			switch {
			case key == "policy" && hasVal:
				switch strings.ToLower(val) {
				case "strict":
					tc.Policy = triagev1.DequeuePolicy_STRICT
				case "weighted":
					tc.Policy = triagev1.DequeuePolicy_WEIGHTED
				default:
					return "", nil, fmt.Errorf("%q: policy %q: allowed weighted or strict", s, val)
				}
			case key == "weights" && hasVal:
				for w := range strings.SplitSeq(val, "/") {
					f, err := strconv.ParseFloat(w, 64)
					if err != nil {
						return "", nil, fmt.Errorf("%q: weight %q is not a number", s, w)
					}
					tc.BandWeights = append(tc.BandWeights, f)
				}
				hasWeights = true
			case key == "at-most-once":
				tc.AtMostOnce = true
				if hasVal {
					b, err := strconv.ParseBool(val)
					if err != nil {
						return "", nil, fmt.Errorf("%q: at-most-once=%q is not true or false", s, val)
					}
					tc.AtMostOnce = b
				}
			case key == "aging" && hasVal:
				d, err := time.ParseDuration(val)
				if err != nil {
					return "", nil, fmt.Errorf("%q: aging %q is not a duration like 30s", s, val)
				}
				tc.AgingThreshold = durationpb.New(d)
			default:
				if ok, err := parseRetryOption(tc, key, val, hasVal); err != nil {
					return "", nil, fmt.Errorf("%q: %w", s, err)
				} else if !ok {
					return "", nil, fmt.Errorf("%q: option %q: want %s", s, opt, topicSyntax)
				}
			}
		}
	}
	if hasWeights && tc.Policy != triagev1.DequeuePolicy_WEIGHTED {
		return "", nil, fmt.Errorf("%q: weights apply only with policy=weighted", s)
	}
	return name, tc, nil
}

// parseRetryOption sets a --topic retry option (max-attempts, backoff,
// jitter) on tc and reports whether key was one.
func parseRetryOption(tc *triagev1.TopicConfig, key, val string, hasVal bool) (bool, error) {
	if !hasVal {
		return false, nil
	}
	switch key {
	case "max-attempts":
		n, err := strconv.ParseInt(val, 10, 32)
		if err != nil || n < 0 {
			return true, fmt.Errorf("max-attempts %q: want a count, 0 for the namespace's", val)
		}
		tc.MaxAttempts = int32(n)
	case "backoff":
		kind, rest, _ := strings.Cut(val, "/")
		b := &triagev1.RetryBackoff{Kind: triagev1.RetryBackoff_EXPONENTIAL}
		if tc.RetryBackoff != nil {
			b.Jitter = tc.RetryBackoff.Jitter // given before backoff=
		}
		parts := strings.Split(rest, "/")
		switch {
		case kind == "fixed" && len(parts) == 1:
			b.Kind = triagev1.RetryBackoff_FIXED
		case kind == "exp" && len(parts) <= 2:
		default:
			return true, fmt.Errorf("backoff %q: want exp/BASE[/CAP] or fixed/DELAY, like exp/1s/15m", val)
		}
		for i, p := range parts {
			d, err := time.ParseDuration(p)
			if err != nil {
				return true, fmt.Errorf("backoff %q: %q is not a duration like 30s", val, p)
			}
			if i == 0 {
				b.Base = durationpb.New(d)
			} else {
				b.Cap = durationpb.New(d)
			}
		}
		tc.RetryBackoff = b
	case "jitter":
		f, err := strconv.ParseFloat(val, 64)
		if err != nil {
			return true, fmt.Errorf("jitter %q: want a fraction from 0 to 1", val)
		}
		if tc.RetryBackoff == nil {
			tc.RetryBackoff = &triagev1.RetryBackoff{}
		}
		tc.RetryBackoff.Jitter = &f
	default:
		return false, nil
	}
	return true, nil
}

// printNamespace prints a namespace as aligned "setting value" lines and a
// table of its topics, or as JSON.
func printNamespace(e *clientEnv, ns *triagev1.Namespace) error {
	if e.json {
		return printJSON(e.stdout, ns)
	}
	tw := newTable(e.stdout)
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, v) }
	noLimit := func(zero bool, v string) string {
		if zero {
			return "no limit"
		}
		return v
	}
	row("name", ns.GetName())
	row("max payload bytes", strconv.Itoa(int(ns.GetMaxPayloadBytes())))
	row("default lease", formatDuration(ns.GetDefaultLeaseDuration()))
	row("max attempts", strconv.Itoa(int(ns.GetMaxAttempts())))
	row("default ttl", durationOr(ns.GetDefaultTtl(), "none"))
	row("enqueue rate", noLimit(ns.GetEnqueueRateLimit() == 0, strconv.FormatFloat(ns.GetEnqueueRateLimit(), 'g', -1, 64)+"/s"))
	row("enqueue burst", strconv.Itoa(int(ns.GetEnqueueBurst())))
	row("max depth", noLimit(ns.GetMaxDepth() == 0, strconv.FormatInt(ns.GetMaxDepth(), 10)))
	row("dedup window", durationOr(ns.GetDedupWindow(), "0s"))
	row("dedup retry window", durationOr(ns.GetDedupRetryWindow(), "5m0s"))
	if len(ns.GetShards()) == 0 {
		row("shards", "-")
	}
	for i, s := range ns.GetShards() {
		k := ""
		if i == 0 {
			k = "shards"
		}
		row(k, s.GetRegion()+"="+joinShardIDs(s.GetShards()))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(ns.GetTopics()) == 0 {
		return nil
	}
	fmt.Fprintln(e.stdout)
	tw = newTable(e.stdout)
	fmt.Fprintln(tw, "TOPIC\tPOLICY\tWEIGHTS\tAT MOST ONCE\tAGING\tMAX ATTEMPTS\tBACKOFF")
	names := make([]string, 0, len(ns.GetTopics()))
	for name := range ns.GetTopics() {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		tc := ns.GetTopics()[name]
		policy, weights := "strict", "-"
		if tc.GetPolicy() == triagev1.DequeuePolicy_WEIGHTED {
			policy, weights = "weighted", "default"
		}
		if len(tc.GetBandWeights()) > 0 {
			w := make([]string, len(tc.GetBandWeights()))
			for i, f := range tc.GetBandWeights() {
				w[i] = strconv.FormatFloat(f, 'g', -1, 64)
			}
			weights = strings.Join(w, "/")
		}
		atMostOnce := "no"
		if tc.GetAtMostOnce() {
			atMostOnce = "yes"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", name, policy, weights, atMostOnce, durationOr(tc.GetAgingThreshold(), "off"),
			maxAttemptsOr(tc.GetMaxAttempts()), formatBackoff(tc.GetRetryBackoff()))
	}
	return tw.Flush()
}

func maxAttemptsOr(n int32) string {
	if n == 0 {
		return "namespace's"
	}
	return strconv.Itoa(int(n))
}

// formatBackoff writes a backoff as --topic takes it.
func formatBackoff(b *triagev1.RetryBackoff) string {
	if b == nil {
		return "default"
	}
	out := "exp/" + formatDuration(b.GetBase()) + "/" + formatDuration(b.GetCap())
	if b.GetKind() == triagev1.RetryBackoff_FIXED {
		out = "fixed/" + formatDuration(b.GetBase())
	}
	return out + " jitter " + strconv.FormatFloat(b.GetJitter(), 'g', -1, 64)
}

func durationOr(d *durationpb.Duration, none string) string {
	if d == nil {
		return none
	}
	return d.AsDuration().String()
}

// perChunk calls send once with no IDs when whole (a call about a whole
// topic), then once per run of at most routing.MaxRefsPerCall of ids.
func perChunk(ids []string, whole bool, send func([]string) error) error {
	if whole {
		if err := send(nil); err != nil {
			return err
		}
	}
	for chunk := range slices.Chunk(ids, routing.MaxRefsPerCall) {
		if err := send(chunk); err != nil {
			return err
		}
	}
	return nil
}

// printCount prints total as JSON, or "label: n" for a reader.
func (e *clientEnv) printCount(total proto.Message, label string, n int64) error {
	if e.json {
		return printJSON(e.stdout, total)
	}
	_, err := fmt.Fprintf(e.stdout, "%s: %d\n", label, n)
	return err
}
