package dequeuer

import (
	"math"
	"time"
)

// Policy is what the lease path needs of a topic's configuration.
type Policy struct {
	// MaxAttempts: an item delivered this many times is dead-lettered
	// instead of delivered again. 0: never.
	MaxAttempts int
	// AtMostOnce: an item whose lease expired is deleted, not redelivered.
	AtMostOnce bool
	// DedupWindow: the dedup keys of items that leave (dead-lettered,
	// expired) stay taken this long.
	DedupWindow time.Duration
}

// band is a priority range of a topic, inclusive.
type band struct{ lo, hi int32 }

var allPriorities = band{math.MinInt32, math.MaxInt32}
