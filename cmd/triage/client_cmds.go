package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/triage-queue/triage/client"
	"github.com/triage-queue/triage/cmd/internal/cli"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/routing"
)

// defaultRouterAddr is where the client verbs look for a router when
// neither --addr nor TRIAGE_ADDR says: the local bed's gRPC port.
const defaultRouterAddr = "127.0.0.1:9090"

// enqueueBatchBytes bounds the payload bytes of one Enqueue sent for items
// read from stdin, well under the router's 64 MiB message limit.
const enqueueBatchBytes = 4 << 20

// clientVerb is one client command. setup registers the verb's own flags
// and returns the function that runs it once the flags are parsed.
type clientVerb struct {
	args    string
	summary string
	setup   func(fs *pflag.FlagSet) clientRun
}

// clientRun runs a verb with its positional arguments.
type clientRun func(ctx context.Context, e *clientEnv, args []string) error

// clientEnv is what every verb gets: the connection, the common flags and
// the streams.
type clientEnv struct {
	c  *client.Client
	ns string
	// region is --region. The client fills it into the requests its
	// interceptor knows; verbs whose requests it does not know set it
	// themselves.
	region  string
	json    bool
	timeout time.Duration
	stdin   io.Reader
	stdout  io.Writer
	stderr  io.Writer
}

// rpc bounds one RPC by --timeout, plus extra for a long poll's wait.
func (e *clientEnv) rpc(ctx context.Context, extra time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, e.timeout+max(extra, 0))
}

// call makes one RPC of method with req, bounded by --timeout.
func call[Req, Resp any](ctx context.Context, e *clientEnv, method func(context.Context, Req, ...grpc.CallOption) (Resp, error), req Req) (Resp, error) {
	ctx, cancel := e.rpc(ctx, 0)
	defer cancel()
	return method(ctx, req)
}

// usagef is a mistake in the command line: exit status 2 and the verb's
// usage.
func usagef(format string, a ...any) error { return cli.Usagef(format, a...) }

// errItemsFailed means some items of a batch failed; they are already
// reported, so only the exit code is left to set.
var errItemsFailed = errors.New("some items failed")

// clientVerbs holds the client verbs by name. A name with a space is a
// sub-verb ("namespace get"): "triage namespace" alone lists its group.
var clientVerbs = map[string]clientVerb{
	"enqueue": {
		args:    "TOPIC [PAYLOAD...]",
		summary: "Enqueue one item per PAYLOAD, or one per non-empty line of stdin when there is none.\nPrints ID, region and \"duplicate\" per item. Put -- before payloads that start with '-'.",
		setup:   enqueueCmd,
	},
	"dequeue": {
		args:    "TOPIC",
		summary: "Lease up to --count ready items, most urgent first, optionally only those within\n--min-priority..--max-priority. Payloads print as text when valid UTF-8 (Go-quoted\nif they hold control characters), else as base64:...",
		setup:   dequeueCmd,
	},
	"ack": {
		args:    "ID:TOKEN...",
		summary: "Delete leased items. Exit code 1 if any item was refused.",
		setup:   ackCmd,
	},
	"nack": {
		args:    "ID:TOKEN...",
		summary: "Return leased items to their topic after --delay, or without --delay after the server's\nexponential backoff (1s * 2^(attempts-1), at most 15m, with jitter). --dead-letter moves them\nto the dead letters now (a permanent failure); --release hands them back uncounted (the\nattempt is taken back, never dead-letters; ready at once without --delay).\nExit code 1 if any item was refused.",
		setup:   nackCmd,
	},
	"extend": {
		args:    "ID:TOKEN",
		summary: "Push a lease's expiry to now + --lease (default: the item's lease duration).",
		setup:   extendCmd,
	},
	"get": {
		args:    "ID",
		summary: "Show one item, leased or not. Once its priority changed, it shows the original and who changed it when.",
		setup:   getCmd,
	},
	"update": {
		args:    "ID",
		summary: "Change an item's priority, deliver_after or metadata; an empty --meta value deletes the key.\n--by names who asks, recorded with a priority change (the server's default: \"api\").",
		setup:   updateCmd,
	},
	"delete": {
		args:    "ID",
		summary: "Delete an item whatever its state.",
		setup:   deleteCmd,
	},
	"stats": {
		args:    "TOPIC",
		summary: "Show a topic's depth and dead letters across the region's shards.",
		setup:   statsCmd,
	},
	"topics": {
		summary: "List the topics that hold items or dead letters, or are paused, with their counts.",
		setup:   topicsCmd,
	},
	"shardmap": {
		summary: "Show the shard map the router serves from.",
		setup:   shardmapCmd,
	},
	"deadletters": {
		args:    "TOPIC",
		summary: "List a topic's dead letters, oldest first: one page of --page-size, or every page with --all.\nPayloads print as dequeue prints them.",
		setup:   deadLettersCmd,
	},
	"redrive": {
		args:    "TOPIC [ID...]",
		summary: "Move dead letters back to their topic, ready now, attempts reset: the listed IDs, or all\nof the topic's when none is given. Prints \"redriven: N\". Exit code 1 if fewer IDs than\nlisted were redriven (not dead letters of TOPIC, or a live item holds their dedup key).",
		setup:   redriveCmd,
	},
	"delete-deadletters": {
		args:    "TOPIC [ID...]",
		summary: "Delete dead letters for good: the listed IDs, or with --all every one of the topic's,\nonly those that died before --before (or longer ago than --older-than) when given.\nPrints \"deleted: N\". Exit code 1 if fewer IDs than listed were deleted.",
		setup:   deleteDeadLettersCmd,
	},
	"pause": {
		args:    "TOPIC",
		summary: "Stop deliveries of a topic in every region until resume: dequeues get nothing of it, long\npolls on it wait; enqueues, acks, nacks and lease extensions go on. Needs the namespace's admin role.",
		setup:   pauseCmd(true),
	},
	"resume": {
		args:    "TOPIC",
		summary: "Deliver a topic on pause again; long polls parked on it wake.",
		setup:   pauseCmd(false),
	},
	"namespace get": {
		args:    "NAME",
		summary: "Show a namespace's configuration.",
		setup:   namespaceGetCmd,
	},
	"namespace put": {
		args:    "NAME",
		summary: namespacePutSummary,
		setup:   namespacePutCmd,
	},
	"namespace patch": {
		args:    "NAME",
		summary: namespacePatchSummary,
		setup:   namespacePatchCmd,
	},
}

// clientCommands returns the client verbs as commands. A verb whose name
// has a space is a sub-command of a group ("namespace get"); the group
// holds the common flags for all of its verbs, so they may come before the
// sub-command's name too ("namespace --json get shop").
func clientCommands() []*cobra.Command {
	var cmds []*cobra.Command
	groups := map[string]*cobra.Command{}
	groupFlags := map[string]*clientFlags{}
	for _, name := range slices.Sorted(maps.Keys(clientVerbs)) {
		group, sub, grouped := strings.Cut(name, " ")
		if !grouped {
			cmd := &cobra.Command{GroupID: groupClient}
			cmds = append(cmds, clientCommand(cmd, name, clientVerbs[name], newClientFlags(cmd.Flags())))
			continue
		}
		g := groups[group]
		if g == nil {
			g = cli.Group(&cobra.Command{Use: group + " COMMAND", GroupID: groupClient})
			groups[group], groupFlags[group] = g, newClientFlags(g.PersistentFlags())
			cmds = append(cmds, g)
		}
		g.AddCommand(clientCommand(&cobra.Command{}, sub, clientVerbs[name], groupFlags[group]))
	}
	for _, g := range groups {
		var subs []string
		for _, sub := range g.Commands() {
			subs = append(subs, sub.Name())
		}
		g.Short = "Sub-commands " + strings.Join(subs, ", ") + "."
	}
	return cmds
}

// clientCommand fills cmd in as verb v named name, run against a router
// with f's common flags.
func clientCommand(cmd *cobra.Command, name string, v clientVerb, f *clientFlags) *cobra.Command {
	cmd.Use = strings.TrimSpace(name + " [flags] " + v.args)
	cmd.Short, cmd.Long = firstSentence(v.summary), v.summary
	if !strings.ContainsAny(v.args, "[.") {
		// A fixed list of arguments is checked before anything else; a
		// verb with optional or repeated ones checks them itself.
		names := strings.Fields(v.args)
		cmd.Args = func(_ *cobra.Command, args []string) error { return wantArgs(args, names...) }
	}
	cmd.RunE = f.runE(v.setup(cmd.Flags()))
	return cmd
}

// firstSentence is the first sentence of a verb's summary, on one line,
// for the binary's list of verbs.
func firstSentence(summary string) string {
	s := strings.Join(strings.Fields(summary), " ")
	if i := strings.Index(s, ". "); i >= 0 {
		return s[:i+1]
	}
	return s
}

// clientFlags are the flags every client verb has.
type clientFlags struct {
	addr, ns, region string
	json             bool
	timeout          time.Duration
}

// newClientFlags registers the common flags on fs.
func newClientFlags(fs *pflag.FlagSet) *clientFlags {
	f := &clientFlags{}
	fs.StringVar(&f.addr, "addr", defaultAddr(os.Getenv), "gRPC address of a router (env TRIAGE_ADDR)")
	fs.StringVarP(&f.ns, "namespace", "n", "default", "namespace")
	fs.StringVar(&f.region, "region", "", "region for enqueue, dequeue, stats, topics, deadletters, redrive and delete-deadletters (default: the router's own)")
	fs.BoolVar(&f.json, "json", false, "print the response as one protojson document")
	fs.DurationVar(&f.timeout, "timeout", 30*time.Second, "deadline of each RPC (a dequeue adds --wait)")
	return f
}

// runE is the prologue and epilogue every client verb shares: check the
// common flags, dial the router, run the verb, and turn what it returns
// into an exit status; an RPC's error prints as "triage: <code>:
// <message>".
func (f *clientFlags) runE(run clientRun) func(*cobra.Command, []string) error {
	return func(c *cobra.Command, args []string) error {
		if f.timeout <= 0 {
			return usagef("--timeout must be positive")
		}
		ctx := c.Context()
		conn, err := client.Dial(ctx, f.addr, client.WithRegion(f.region), client.WithDialOptions(dialSecurity(os.Getenv)...))
		if err == nil {
			defer conn.Close()
			err = run(ctx, &clientEnv{
				c: conn, ns: f.ns, region: f.region, json: f.json, timeout: f.timeout,
				stdin: c.InOrStdin(), stdout: c.OutOrStdout(), stderr: c.ErrOrStderr(),
			}, args)
		}
		switch {
		case err == nil, cli.IsUsage(err):
			return err
		case errors.Is(err, errItemsFailed):
			return cli.Exit(1)
		}
		fmt.Fprintf(c.ErrOrStderr(), "triage: %s\n", describeError(err))
		return cli.Exit(1)
	}
}

// flagsSet returns the names of the flags the command line gave, so a verb
// can tell "--priority 0" from no --priority.
func flagsSet(fs *pflag.FlagSet) map[string]bool {
	set := map[string]bool{}
	fs.Visit(func(f *pflag.Flag) { set[f.Name] = true })
	return set
}

func defaultAddr(getenv func(string) string) string {
	if a := getenv("TRIAGE_ADDR"); a != "" {
		return a
	}
	return defaultRouterAddr
}

// describeError renders an error as "<grpc code>: <message>", or as it is
// when it carries no gRPC status.
func describeError(err error) string {
	if s, ok := status.FromError(err); ok {
		return fmt.Sprintf("%s: %s", s.Code(), s.Message())
	}
	return err.Error()
}

// metaFlag collects repeated --meta k=v flags.
type metaFlag map[string]string

func (m metaFlag) String() string {
	kv := make([]string, 0, len(m))
	for k, v := range m {
		kv = append(kv, k+"="+v)
	}
	slices.Sort(kv)
	return strings.Join(kv, ",")
}

// Type names the value in usage lines that give no `name` of their own.
func (m metaFlag) Type() string { return "k=v" }

func (m metaFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("%q is not k=v", s)
	}
	m[k] = v
	return nil
}

func checkInt32(name string, v int) (int32, error) {
	if v < math.MinInt32 || v > math.MaxInt32 {
		return 0, usagef("--%s %d is out of range", name, v)
	}
	return int32(v), nil
}

func wantArgs(args []string, names ...string) error {
	if len(args) < len(names) {
		return usagef("missing %s", names[len(args)])
	}
	if len(args) > len(names) {
		return usagef("unexpected argument %q", args[len(names)])
	}
	return nil
}

// parseRefs splits one or more "ID:TOKEN" arguments.
func parseRefs(args []string) (ids, tokens []string, err error) {
	if len(args) == 0 {
		return nil, nil, usagef("missing ID:TOKEN")
	}
	for _, a := range args {
		id, token, err := parseRef(a)
		if err != nil {
			return nil, nil, err
		}
		ids, tokens = append(ids, id), append(tokens, token)
	}
	return ids, tokens, nil
}

// parseRef splits "ID:TOKEN". IDs hold '-' but never ':', so the first ':'
// separates them.
func parseRef(s string) (id, token string, err error) {
	id, token, ok := strings.Cut(s, ":")
	if !ok || id == "" || token == "" {
		return "", "", usagef("%q is not ID:TOKEN", s)
	}
	return id, token, nil
}

// enqueueFlags are enqueue's own flags: what every item it sends carries.
type enqueueFlags struct {
	priority          int
	delay, lease, ttl time.Duration
	dedup             string
	meta              metaFlag
	buffered          bool
}

// newEnqueueFlags registers enqueue's own flags on fs.
func newEnqueueFlags(fs *pflag.FlagSet) *enqueueFlags {
	f := &enqueueFlags{meta: metaFlag{}}
	fs.IntVar(&f.priority, "priority", 0, "priority; lower is more urgent")
	fs.DurationVar(&f.delay, "delay", 0, "deliver no sooner than this long from now")
	fs.DurationVar(&f.lease, "lease", 0, "lease a dequeue takes when it does not say (default: the namespace's)")
	fs.DurationVar(&f.ttl, "ttl", 0, "delete the item this long after enqueue (default: the namespace's)")
	fs.StringVar(&f.dedup, "dedup", "", "dedup key: an item whose key the topic already holds is reported as a duplicate")
	fs.Var(f.meta, "meta", "metadata `k=v` (repeatable)")
	fs.BoolVar(&f.buffered, "buffered", false, "acknowledge once the JetStream buffer holds the batch (durability BUFFERED)")
	return f
}

// durability is what the router waits for before it answers: the commit
// to MariaDB, or with --buffered the JetStream buffer only.
func (f *enqueueFlags) durability() triagev1.Durability {
	if f.buffered {
		return triagev1.Durability_BUFFERED
	}
	return triagev1.Durability_COMMITTED
}

// newItem builds the item for payload p with priority prio. --delay counts
// from the moment the item is built, so a line read late from stdin waits
// its full delay too.
func (f *enqueueFlags) newItem(p []byte, prio int32) *triagev1.NewItem {
	it := &triagev1.NewItem{Payload: p, Priority: prio, DedupKey: f.dedup}
	if f.delay != 0 {
		it.DeliverAfter = timestamppb.New(time.Now().Add(f.delay))
	}
	if f.lease != 0 {
		it.LeaseDuration = durationpb.New(f.lease)
	}
	if f.ttl != 0 {
		it.Ttl = durationpb.New(f.ttl)
	}
	if len(f.meta) > 0 {
		it.Metadata = f.meta
	}
	return it
}

// enqueueCmd is the enqueue verb: one item per PAYLOAD argument, or one
// per non-empty line of stdin when there is none, all with the same
// flags.
func enqueueCmd(fs *pflag.FlagSet) clientRun {
	f := newEnqueueFlags(fs)
	return func(ctx context.Context, e *clientEnv, args []string) error {
		if len(args) == 0 {
			return usagef("missing TOPIC")
		}
		topic, payloads := args[0], args[1:]
		prio, err := checkInt32("priority", f.priority)
		if err != nil {
			return err
		}
		s := &enqueueSender{e: e, topic: topic, durability: f.durability(), all: &triagev1.EnqueueResponse{}}
		newItem := func(p []byte) *triagev1.NewItem { return f.newItem(p, prio) }
		if len(payloads) > 0 {
			err = s.sendPayloads(ctx, payloads, newItem)
		} else {
			err = s.sendLines(ctx, newItem)
		}
		if err != nil {
			return err
		}
		if e.json {
			return printJSON(e.stdout, s.all)
		}
		return nil
	}
}

// enqueueSender sends one topic's items in batches. Without --json it
// prints each batch's results as they come back, so a long-running
// producer piped in sees its items enqueued along the way; with --json it
// gathers them in all, for one document at the end.
type enqueueSender struct {
	e          *clientEnv
	topic      string
	durability triagev1.Durability
	all        *triagev1.EnqueueResponse
}

// send enqueues one batch, bounded by --timeout, and prints or gathers
// its results: ID, region and "duplicate" per item.
func (s *enqueueSender) send(ctx context.Context, items []*triagev1.NewItem) error {
	e := s.e
	rctx, cancel := e.rpc(ctx, 0)
	defer cancel()
	resp, err := e.c.Queue.Enqueue(rctx, &triagev1.EnqueueRequest{
		Namespace: e.ns, Topic: s.topic, Items: items, Durability: s.durability,
	})
	if err != nil {
		return err
	}
	if e.json {
		s.all.Results = append(s.all.Results, resp.GetResults()...)
		return nil
	}
	tw := newTable(e.stdout)
	for _, r := range resp.GetResults() {
		dup := ""
		if r.GetDuplicate() {
			dup = "duplicate"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", r.GetId(), r.GetRegion(), dup)
	}
	return tw.Flush()
}

// sendPayloads enqueues one item per PAYLOAD argument, in batches of at
// most the router's routing.MaxItemsPerEnqueue.
func (s *enqueueSender) sendPayloads(ctx context.Context, payloads []string, newItem func([]byte) *triagev1.NewItem) error {
	for chunk := range slices.Chunk(payloads, routing.MaxItemsPerEnqueue) {
		items := make([]*triagev1.NewItem, len(chunk))
		for i, p := range chunk {
			items[i] = newItem([]byte(p))
		}
		if err := s.send(ctx, items); err != nil {
			return err
		}
	}
	return nil
}

// sendLines enqueues one item per non-empty line of stdin. Lines are sent
// in batches as they arrive (at most routing.MaxItemsPerEnqueue items or
// about enqueueBatchBytes of payload each), so a long-running producer
// piped in sees its items enqueued along the way. Stdin with no line at
// all is a usage error: there was nothing to enqueue.
func (s *enqueueSender) sendLines(ctx context.Context, newItem func([]byte) *triagev1.NewItem) error {
	sc := bufio.NewScanner(s.e.stdin)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	var batch []*triagev1.NewItem
	size, sent := 0, 0
	for sc.Scan() {
		if len(sc.Bytes()) == 0 {
			continue
		}
		batch = append(batch, newItem(slices.Clone(sc.Bytes())))
		size += len(sc.Bytes())
		if len(batch) == routing.MaxItemsPerEnqueue || size >= enqueueBatchBytes {
			if err := s.send(ctx, batch); err != nil {
				return err
			}
			sent += len(batch)
			batch, size = nil, 0
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("reading stdin: %w", err)
	}
	if len(batch) > 0 {
		if err := s.send(ctx, batch); err != nil {
			return err
		}
		sent += len(batch)
	}
	if sent == 0 {
		return usagef("no PAYLOAD arguments and no lines on stdin")
	}
	return nil
}

// dequeueFlags are dequeue's own flags: what the request asks for, and
// whether to ack what it gets.
type dequeueFlags struct {
	count            int
	lease, wait      time.Duration
	ack              bool
	minPrio, maxPrio int
}

// newDequeueFlags registers dequeue's own flags on fs.
func newDequeueFlags(fs *pflag.FlagSet) *dequeueFlags {
	f := &dequeueFlags{}
	fs.IntVar(&f.count, "count", 1, "lease up to this many items")
	fs.DurationVar(&f.lease, "lease", 0, "lease for every item returned (default: each item's own)")
	fs.DurationVar(&f.wait, "wait", 0, "long poll: wait up to this long for at least one item")
	fs.BoolVar(&f.ack, "ack", false, "ack the items right after printing them")
	fs.IntVar(&f.minPrio, "min-priority", 0, "lease only items whose priority is >= this (default: no bound)")
	fs.IntVar(&f.maxPrio, "max-priority", 0, "lease only items whose priority is <= this, the most urgent band (default: no bound)")
	return f
}

// request builds the Dequeue request for topic in namespace ns, or a
// usage error for flags out of range. set holds the flags the command
// line gave: 0 is a priority like any other, so a bound is sent when its
// flag is given, whatever its value.
func (f *dequeueFlags) request(ns, topic string, set map[string]bool) (*triagev1.DequeueRequest, error) {
	if f.count < 1 || f.count > math.MaxInt32 {
		return nil, usagef("--count must be at least 1")
	}
	req := &triagev1.DequeueRequest{
		Namespace: ns,
		Topics:    []*triagev1.TopicCount{{Topic: topic, Count: int32(f.count)}},
	}
	if f.lease != 0 {
		req.LeaseDuration = durationpb.New(f.lease)
	}
	if f.wait != 0 {
		req.Wait = durationpb.New(f.wait)
	}
	if set["min-priority"] {
		p, err := checkInt32("min-priority", f.minPrio)
		if err != nil {
			return nil, err
		}
		req.MinPriority = &p
	}
	if set["max-priority"] {
		p, err := checkInt32("max-priority", f.maxPrio)
		if err != nil {
			return nil, err
		}
		req.MaxPriority = &p
	}
	if req.MinPriority != nil && req.MaxPriority != nil && *req.MinPriority > *req.MaxPriority {
		return nil, usagef("--min-priority %d is above --max-priority %d", *req.MinPriority, *req.MaxPriority)
	}
	return req, nil
}

// dequeueCmd is the dequeue verb: lease up to --count items of one
// topic, print them, and with --ack ack them at once.
func dequeueCmd(fs *pflag.FlagSet) clientRun {
	f := newDequeueFlags(fs)
	return func(ctx context.Context, e *clientEnv, args []string) error {
		req, err := f.request(e.ns, args[0], flagsSet(fs))
		if err != nil {
			return err
		}
		// A long poll may hold the RPC for --wait on top of --timeout.
		rctx, cancel := e.rpc(ctx, f.wait)
		defer cancel()
		resp, err := e.c.Queue.Dequeue(rctx, req)
		if err != nil {
			return err
		}
		items := resp.GetItems()
		if err := printLeased(e, items); err != nil {
			return err
		}
		if !f.ack || len(items) == 0 {
			return nil
		}
		return ackLeased(ctx, e, items)
	}
}

// printLeased prints the items a dequeue leased, one table row each with
// the lease token an ack or nack needs, or as JSON; "no items" goes to
// stderr so a script reading stdout sees nothing.
func printLeased(e *clientEnv, items []*triagev1.LeasedItem) error {
	if e.json {
		return printJSON(e.stdout, &triagev1.DequeueResponse{Items: items})
	}
	if len(items) == 0 {
		fmt.Fprintln(e.stderr, "no items")
		return nil
	}
	tw := newTable(e.stdout)
	fmt.Fprintln(tw, "ID\tPRIORITY\tATTEMPTS\tLEASE TOKEN\tLEASE EXPIRES\tPAYLOAD")
	for _, it := range items {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\n", it.GetId(), it.GetPriority(), it.GetAttempts(),
			it.GetLeaseToken(), formatTime(it.GetLeaseExpiresAt()), payloadText(it.GetPayload()))
	}
	return tw.Flush()
}

// ackLeased acks what dequeue --ack printed. A refused item is reported
// on stderr and fails the command with errItemsFailed.
func ackLeased(ctx context.Context, e *clientEnv, items []*triagev1.LeasedItem) error {
	actx, cancel := e.rpc(ctx, 0)
	defer cancel()
	results, err := e.c.Ack(actx, e.ns, items...)
	if err != nil {
		return fmt.Errorf("ack: %w", err)
	}
	failed := false
	for _, r := range results {
		if !r.GetOk() {
			fmt.Fprintf(e.stderr, "triage: ack %s: %s\n", r.GetId(), r.GetError())
			failed = true
		}
	}
	if failed {
		return errItemsFailed
	}
	return nil
}

// reportItemResults prints an ack or nack answer (as JSON with --json) and
// fails with errItemsFailed when an item was refused.
func reportItemResults(e *clientEnv, resp proto.Message, ids []string, results []*triagev1.ItemResult) error {
	if !e.json {
		return printItemResults(e, ids, results)
	}
	if err := printJSON(e.stdout, resp); err != nil {
		return err
	}
	if itemResultsFailed(len(ids), results) {
		return errItemsFailed
	}
	return nil
}

// printItemResults prints one line per ref, ok or the server's reason, and
// reports errItemsFailed if any item failed or got no result.
func printItemResults(e *clientEnv, ids []string, results []*triagev1.ItemResult) error {
	failed := false
	tw := newTable(e.stdout)
	for i, id := range ids {
		var r *triagev1.ItemResult
		if i < len(results) {
			r = results[i]
		}
		switch {
		case r == nil:
			failed = true
			fmt.Fprintf(tw, "%s\terror: no result from the server\n", id)
		case r.GetOk():
			fmt.Fprintf(tw, "%s\tok\n", cmp.Or(r.GetId(), id))
		default:
			failed = true
			fmt.Fprintf(tw, "%s\terror: %s\n", cmp.Or(r.GetId(), id), r.GetError())
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if failed {
		return errItemsFailed
	}
	return nil
}

// itemResultsFailed reports whether a JSON-printed batch had a failure.
func itemResultsFailed(n int, results []*triagev1.ItemResult) bool {
	if len(results) < n {
		return true
	}
	return slices.ContainsFunc(results, func(r *triagev1.ItemResult) bool { return !r.GetOk() })
}

func ackCmd(_ *pflag.FlagSet) clientRun {
	return func(ctx context.Context, e *clientEnv, args []string) error {
		ids, tokens, err := parseRefs(args)
		if err != nil {
			return err
		}
		req := &triagev1.AckRequest{Namespace: e.ns}
		for i, id := range ids {
			req.Acks = append(req.Acks, &triagev1.LeaseRef{Id: id, LeaseToken: tokens[i]})
		}
		resp, err := call(ctx, e, e.c.Queue.Ack, req)
		if err != nil {
			return err
		}
		return reportItemResults(e, resp, ids, resp.GetResults())
	}
}

func nackCmd(fs *pflag.FlagSet) clientRun {
	delay := fs.Duration("delay", 0, "redeliver after this delay; 0s for at once (default: the server's exponential backoff)")
	errMsg := fs.String("error", "", "last error, kept on the item")
	meta := metaFlag{}
	fs.Var(meta, "meta", "metadata `k=v` merged into the item's; an empty value deletes the key (repeatable)")
	dead := fs.Bool("dead-letter", false, "move the items to their topic's dead letters now, whatever attempts they have left (a retry cannot succeed)")
	release := fs.Bool("release", false, "hand the items back uncounted: the attempt is taken back, never dead-letters; ready at once unless --delay")
	return func(ctx context.Context, e *clientEnv, args []string) error {
		ids, tokens, err := parseRefs(args)
		if err != nil {
			return err
		}
		// Without --delay the field stays unset and the server backs off
		// exponentially; "--delay 0s" is sent and means at once.
		delaySet := flagsSet(fs)["delay"]
		// The server refuses both at once, and ignores a delay with
		// dead_letter: say so here rather than let a flag do nothing.
		switch {
		case *dead && *release:
			return usagef("--dead-letter and --release exclude each other: one ends the item, the other hands it back uncounted")
		case *dead && delaySet:
			return usagef("--delay has no effect with --dead-letter: the item is not redelivered")
		}
		req := &triagev1.NackRequest{Namespace: e.ns}
		for i, id := range ids {
			n := &triagev1.NackItem{Id: id, LeaseToken: tokens[i], Error: *errMsg, DeadLetter: *dead, Release: *release}
			if delaySet {
				n.Delay = durationpb.New(*delay)
			}
			if len(meta) > 0 {
				n.Metadata = meta
			}
			req.Nacks = append(req.Nacks, n)
		}
		resp, err := call(ctx, e, e.c.Queue.Nack, req)
		if err != nil {
			return err
		}
		return reportItemResults(e, resp, ids, resp.GetResults())
	}
}

func extendCmd(fs *pflag.FlagSet) clientRun {
	lease := fs.Duration("lease", 0, "new lease, counted from now (default: the item's lease duration)")
	return func(ctx context.Context, e *clientEnv, args []string) error {
		id, tok, err := parseRef(args[0])
		if err != nil {
			return err
		}
		req := &triagev1.ExtendLeaseRequest{Namespace: e.ns, Id: id, LeaseToken: tok}
		if *lease != 0 {
			req.LeaseDuration = durationpb.New(*lease)
		}
		resp, err := call(ctx, e, e.c.Queue.ExtendLease, req)
		if err != nil {
			return err
		}
		if e.json {
			return printJSON(e.stdout, resp)
		}
		_, err = fmt.Fprintf(e.stdout, "%s  leased until %s\n", id, formatTime(resp.GetLeaseExpiresAt()))
		return err
	}
}

func getCmd(_ *pflag.FlagSet) clientRun {
	return func(ctx context.Context, e *clientEnv, args []string) error {
		it, err := call(ctx, e, e.c.Queue.GetItem, &triagev1.GetItemRequest{Namespace: e.ns, Id: args[0]})
		if err != nil {
			return err
		}
		return printItem(e, it)
	}
}

func updateCmd(fs *pflag.FlagSet) clientRun {
	priority := fs.Int("priority", 0, "new priority; lower is more urgent")
	deliverAfter := fs.String("deliver-after", "", "not delivered before this `RFC3339` time")
	delay := fs.Duration("delay", 0, "not delivered before this long from now (instead of --deliver-after)")
	meta := metaFlag{}
	fs.Var(meta, "meta", "metadata `k=v` merged into the item's; an empty value deletes the key (repeatable)")
	by := fs.String("by", "", "who asks for the change, recorded with a priority change (default: the server's, \"api\")")
	return func(ctx context.Context, e *clientEnv, args []string) error {
		set := flagsSet(fs)
		req := &triagev1.UpdateItemRequest{Namespace: e.ns, Id: args[0], UpdatedBy: *by}
		if set["priority"] {
			p, err := checkInt32("priority", *priority)
			if err != nil {
				return err
			}
			req.Priority = &p
		}
		switch {
		case set["deliver-after"] && set["delay"]:
			return usagef("give --deliver-after or --delay, not both")
		case set["deliver-after"]:
			t, err := time.Parse(time.RFC3339, *deliverAfter)
			if err != nil {
				return usagef("--deliver-after %q is not an RFC3339 time like YYYY-MM-DDThh:mm:ssZ", *deliverAfter)
			}
			req.DeliverAfter = timestamppb.New(t)
		case set["delay"]:
			req.DeliverAfter = timestamppb.New(time.Now().Add(*delay))
		}
		if len(meta) > 0 {
			req.Metadata = meta
		}
		if req.Priority == nil && req.DeliverAfter == nil && req.Metadata == nil {
			return usagef("nothing to update: give --priority, --deliver-after, --delay or --meta")
		}
		it, err := call(ctx, e, e.c.Queue.UpdateItem, req)
		if err != nil {
			return err
		}
		return printItem(e, it)
	}
}

func deleteCmd(_ *pflag.FlagSet) clientRun {
	return func(ctx context.Context, e *clientEnv, args []string) error {
		resp, err := call(ctx, e, e.c.Queue.DeleteItem, &triagev1.DeleteItemRequest{Namespace: e.ns, Id: args[0]})
		if err != nil {
			return err
		}
		if e.json {
			return printJSON(e.stdout, resp)
		}
		_, err = fmt.Fprintf(e.stdout, "%s  deleted\n", args[0])
		return err
	}
}

func statsCmd(_ *pflag.FlagSet) clientRun {
	return func(ctx context.Context, e *clientEnv, args []string) error {
		st, err := call(ctx, e, e.c.Queue.GetTopicStats, &triagev1.GetTopicStatsRequest{Namespace: e.ns, Topic: args[0]})
		if err != nil {
			return err
		}
		if e.json {
			return printJSON(e.stdout, st)
		}
		tw := newTable(e.stdout)
		fmt.Fprintf(tw, "namespace\t%s\n", st.GetNamespace())
		fmt.Fprintf(tw, "topic\t%s\n", st.GetTopic())
		fmt.Fprintf(tw, "ready\t%d\n", st.GetReady())
		fmt.Fprintf(tw, "leased\t%d\n", st.GetLeased())
		fmt.Fprintf(tw, "delayed\t%d\n", st.GetDelayed())
		fmt.Fprintf(tw, "total\t%d\n", st.GetTotal())
		fmt.Fprintf(tw, "dead letters\t%d\n", st.GetDeadLetters())
		fmt.Fprintf(tw, "paused\t%t\n", st.GetPaused())
		fmt.Fprintf(tw, "oldest ready age\t%s\n", formatDuration(st.GetOldestReadyAge()))
		if len(st.GetReadyByPriority()) > 0 {
			fmt.Fprintln(tw, "\nPRIORITY\tREADY")
			for _, d := range st.GetReadyByPriority() {
				fmt.Fprintf(tw, "%d\t%d\n", d.GetPriority(), d.GetReady())
			}
		}
		return tw.Flush()
	}
}

func topicsCmd(_ *pflag.FlagSet) clientRun {
	return func(ctx context.Context, e *clientEnv, _ []string) error {
		// Follow the pages to the end so the output is the whole list; a
		// token seen twice would loop forever, so it ends the walk.
		all := &triagev1.ListTopicsResponse{}
		seen := map[string]bool{}
		for token := ""; ; {
			rctx, cancel := e.rpc(ctx, 0)
			resp, err := e.c.Queue.ListTopics(rctx, &triagev1.ListTopicsRequest{Namespace: e.ns, PageToken: token})
			cancel()
			if err != nil {
				return err
			}
			all.Topics = append(all.Topics, resp.GetTopics()...)
			token = resp.GetNextPageToken()
			if token == "" || seen[token] {
				break
			}
			seen[token] = true
		}
		if e.json {
			return printJSON(e.stdout, all)
		}
		tw := newTable(e.stdout)
		// The PAUSED column shows only when a topic is paused.
		paused := slices.ContainsFunc(all.Topics, (*triagev1.TopicSummary).GetPaused)
		fmt.Fprint(tw, "TOPIC\tITEMS\tDEAD LETTERS")
		if paused {
			fmt.Fprint(tw, "\tPAUSED")
		}
		fmt.Fprintln(tw)
		for _, t := range all.Topics {
			fmt.Fprintf(tw, "%s\t%d\t%d", t.GetTopic(), t.GetItems(), t.GetDeadLetters())
			if paused {
				fmt.Fprintf(tw, "\t%s", map[bool]string{true: "paused", false: "-"}[t.GetPaused()])
			}
			fmt.Fprintln(tw)
		}
		return tw.Flush()
	}
}

func shardmapCmd(_ *pflag.FlagSet) clientRun {
	return func(ctx context.Context, e *clientEnv, _ []string) error {
		m, err := call(ctx, e, e.c.Admin.GetShardMap, &triagev1.GetShardMapRequest{})
		if err != nil {
			return err
		}
		if e.json {
			return printJSON(e.stdout, m)
		}
		tw := newTable(e.stdout)
		fmt.Fprintf(tw, "version\t%d\n", m.GetVersion())
		fmt.Fprintf(tw, "regions\t%s\n", strings.Join(m.GetRegions(), ", "))
		if err := tw.Flush(); err != nil {
			return err
		}
		fmt.Fprintln(e.stdout)
		tw = newTable(e.stdout)
		fmt.Fprintln(tw, "SHARD\tHOME REGION\tPRIMARY\tREPLICAS\tEPOCH")
		for _, s := range m.GetShards() {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\n", s.GetId(), s.GetHomeRegion(), s.GetPrimary(),
				orDash(strings.Join(s.GetReplicas(), ",")), s.GetEpoch())
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		fmt.Fprintln(e.stdout)
		tw = newTable(e.stdout)
		fmt.Fprintln(tw, "NAMESPACE\tREGION\tSHARDS")
		for _, n := range m.GetNamespaces() {
			ids := make([]string, len(n.GetShards()))
			for i, id := range n.GetShards() {
				ids[i] = strconv.FormatUint(uint64(id), 10)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\n", n.GetNamespace(), n.GetRegion(), strings.Join(ids, ","))
		}
		return tw.Flush()
	}
}

// printItem prints an item as aligned "field value" lines, or as JSON.
func printItem(e *clientEnv, it *triagev1.Item) error {
	if e.json {
		return printJSON(e.stdout, it)
	}
	tw := newTable(e.stdout)
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, v) }
	row("id", it.GetId())
	row("namespace", it.GetNamespace())
	row("topic", it.GetTopic())
	row("region", orDash(it.GetRegion()))
	row("state", it.GetState().String())
	row("priority", strconv.Itoa(int(it.GetPriority())))
	// The server fills original_priority on every item, but it only says
	// something once the priority changed, which the who and when mark.
	if it.GetPriorityChangedBy() != "" || it.GetPriorityChangedAt() != nil {
		row("original priority", strconv.Itoa(int(it.GetOriginalPriority())))
		row("priority changed by", orDash(it.GetPriorityChangedBy()))
		row("priority changed at", formatTime(it.GetPriorityChangedAt()))
	}
	attempts := strconv.Itoa(int(it.GetAttempts()))
	if it.GetMaxAttempts() > 0 {
		attempts += " of " + strconv.Itoa(int(it.GetMaxAttempts()))
	}
	row("attempts", attempts)
	row("enqueued at", formatTime(it.GetEnqueuedAt()))
	row("deliver after", formatTime(it.GetDeliverAfter()))
	row("updated at", formatTime(it.GetUpdatedAt()))
	row("lease duration", formatDuration(it.GetLeaseDuration()))
	row("lease expires", formatTime(it.GetLeaseExpiresAt()))
	row("expires at", formatTime(it.GetExpiresAt()))
	row("dedup key", orDash(it.GetDedupKey()))
	row("last error", orDash(it.GetLastError()))
	keys := make([]string, 0, len(it.GetMetadata()))
	for k := range it.GetMetadata() {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if len(keys) == 0 {
		row("metadata", "-")
	}
	for i, k := range keys {
		name := ""
		if i == 0 {
			name = "metadata"
		}
		row(name, k+"="+it.GetMetadata()[k])
	}
	row("payload", payloadText(it.GetPayload()))
	return tw.Flush()
}

func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
}

// printJSON writes m as one protojson document with proto field names and
// every field present, so scripts can rely on the keys.
func printJSON(w io.Writer, m proto.Message) error {
	b, err := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true, Multiline: true, Indent: "  "}.Marshal(m)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// payloadText shows a payload on one line of a table: as it is when it is
// printable UTF-8, Go-quoted when it holds control characters (a newline
// or tab would break the columns), else as "base64:" and the bytes in
// standard base64. --json gives the exact bytes in every case.
func payloadText(p []byte) string {
	if !utf8.Valid(p) {
		return "base64:" + base64.StdEncoding.EncodeToString(p)
	}
	return cellText(string(p))
}

// cellText keeps a string on one table cell: Go-quoted when it holds
// control characters (or is not UTF-8), as it is otherwise.
func cellText(s string) string {
	if !utf8.ValidString(s) || strings.ContainsFunc(s, unicode.IsControl) {
		return strconv.Quote(s)
	}
	return s
}

func formatTime(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "-"
	}
	return ts.AsTime().UTC().Format(time.DateOnly + "T" + time.TimeOnly + ".000Z07:00")
}

func formatDuration(d *durationpb.Duration) string {
	if d == nil {
		return "-"
	}
	return d.AsDuration().String()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
