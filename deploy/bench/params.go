package bench

import "time"

// params sizes a run. Full runs measure for long enough that a few
// hiccups of a shared two-core box do not decide the result; quick runs
// only prove that every path works.
type params struct {
	progressEvery time.Duration
	// settleWait bounds the wait after a bulk fill (see settle).
	settleWait time.Duration
	// warmup and measure apply to every closed-loop scenario.
	warmup, measure time.Duration

	// Baselines.
	insertTrials []insertTrial
	leaseTrials  []leaseTrial
	trialMeasure time.Duration // per ceiling trial
	// naive-enqueue runs with each of enqueue1Clients and naive-dequeue-ack
	// with each dequeue trial's consumer count: "same concurrency".
	naiveMeasure time.Duration

	// Triage.
	enqueue1Clients                          []int // trials of triage-enqueue-batch1
	enqueue100Clients, jsonClients           int
	dequeueTrials                            []dequeueTrial
	deepBacklog, shallowBacklog              int
	backlogRounds, backlogRoundItems         int
	backlogConsumers, backlogCount           int
	mixedWarmup, mixedMeasure                time.Duration
	probeWarmup, probeMeasure                time.Duration
	mixedConsumers, mixedCount, mixedSenders int
	// triage-steady: a trial per producer count (its consumers are the
	// mixed scenario's), each measured for steadyMeasure.
	steadyProducers []int
	steadyMeasure   time.Duration

	// River's rows: river-insert-many's goroutines, river-backlog's jobs.
	// river-steady runs triage-steady's producer counts and windows.
	riverInsertClients, riverBacklog int
}

// insertTrial writes with workers writers per shard, on one shard or on
// every shard of the bed (allShards).
type insertTrial struct {
	allShards      bool
	workers, batch int
}

// leaseTrial leases and acks on one shard or on every shard (allShards).
type leaseTrial struct {
	strategy  string // "owner" or "skip-locked"
	allShards bool
	workers   int // per shard: ack workers (owner) or leasing workers (skip-locked)
	batch     int
}

type dequeueTrial struct{ consumers, count int }

func paramsFor(quick bool) params {
	p := params{
		progressEvery: 2 * time.Second,
		settleWait:    30 * time.Second,
		warmup:        2 * time.Second,
		measure:       10 * time.Second,
		insertTrials: []insertTrial{{false, 2, 1000}, {false, 4, 500}, {false, 8, 200},
			{true, 2, 1000}, {true, 4, 500}},
		leaseTrials: []leaseTrial{{"owner", false, 4, 100}, {"owner", false, 4, 200}, {"owner", false, 4, 500},
			{"owner", true, 2, 200}, {"owner", true, 4, 200},
			{"skip-locked", false, 4, 100}, {"skip-locked", false, 8, 100}, {"skip-locked", false, 4, 200},
			{"skip-locked", true, 4, 100}},
		trialMeasure:      5 * time.Second,
		naiveMeasure:      6 * time.Second,
		enqueue1Clients:   []int{64, 256, 512},
		enqueue100Clients: 32,
		jsonClients:       32,
		dequeueTrials:     []dequeueTrial{{16, 100}, {32, 100}, {8, 100}},
		deepBacklog:       5_000_000,
		shallowBacklog:    10_000,
		backlogRounds:     6,
		backlogRoundItems: 5_000,
		backlogConsumers:  8,
		backlogCount:      10,
		mixedWarmup:       2 * time.Second,
		probeWarmup:       2 * time.Second,
		probeMeasure:      5 * time.Second,
		mixedMeasure:      20 * time.Second,
		mixedConsumers:    16,
		mixedCount:        10,
		mixedSenders:      512,
		steadyProducers:   []int{64, 512},
		steadyMeasure:     20 * time.Second,
		// A few goroutines: each InsertMany of 100 is one transaction,
		// so a few keep Postgres's group commit busy.
		riverInsertClients: 8,
		riverBacklog:       100_000,
	}
	if quick {
		p.progressEvery = time.Second
		p.settleWait = 3 * time.Second
		p.warmup, p.measure = 500*time.Millisecond, 1500*time.Millisecond
		p.insertTrials = []insertTrial{{false, 4, 500}, {true, 2, 500}}
		p.leaseTrials = []leaseTrial{{"owner", true, 4, 200}, {"skip-locked", false, 4, 100}}
		p.trialMeasure = 1500 * time.Millisecond
		p.naiveMeasure = 1500 * time.Millisecond
		p.dequeueTrials = p.dequeueTrials[:1]
		p.enqueue1Clients = p.enqueue1Clients[:1]
		p.deepBacklog = 200_000
		p.backlogRounds = 2
		p.mixedWarmup, p.mixedMeasure = 500*time.Millisecond, 3*time.Second
		p.probeWarmup, p.probeMeasure = 500*time.Millisecond, 1500*time.Millisecond
		p.steadyProducers, p.steadyMeasure = []int{64}, 1500*time.Millisecond
		p.riverBacklog = 5_000
	}
	return p
}
