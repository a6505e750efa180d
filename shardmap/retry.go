package shardmap

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// Backoff is how long a nack that gives no delay waits before its item is
// ready again, after the item's n-th delivery: Base·2^(n−1) up to Cap, or
// Base every time when Fixed. Jitter takes a random fraction, up to that
// much, off each delay so items that failed together do not come back
// together. The map stores it with every field set (PutNamespace fills the
// defaults), so what a GET shows is what a nack does.
type Backoff struct {
	Fixed  bool     `json:"fixed,omitempty"`
	Base   Duration `json:"base"`
	Cap    Duration `json:"cap,omitempty"`
	Jitter float64  `json:"jitter,omitempty"`
}

// DefaultBackoff is the nack delay of a topic that sets none: 1s
// doubling per delivery up to 15 minutes, jitter 0.5.
var DefaultBackoff = Backoff{Base: Duration(time.Second), Cap: Duration(15 * time.Minute), Jitter: 0.5}

// MaxBackoff bounds a backoff's base and cap: a longer wait is a
// schedule, which a nack's explicit delay (or deliver_after) says better.
const MaxBackoff = 24 * time.Hour

// Delay is the wait after the attempts-th delivery.
func (b Backoff) Delay(attempts int) time.Duration {
	d := time.Duration(b.Base)
	if !b.Fixed {
		// Doubling past 2^40 overflows nothing but the cap: stop there.
		for n := 1; n < attempts && d < time.Duration(b.Cap) && n < 40; n++ {
			d *= 2
		}
		d = min(d, time.Duration(b.Cap))
	}
	return time.Duration(float64(d) * (1 - b.Jitter*rand.Float64()))
}

func (b Backoff) validate() error {
	switch {
	case time.Duration(b.Base) < time.Millisecond || time.Duration(b.Base) > MaxBackoff:
		return fmt.Errorf("base must be within 1ms..%s", MaxBackoff)
	case !b.Fixed && (b.Cap < b.Base || time.Duration(b.Cap) > MaxBackoff):
		return fmt.Errorf("cap must be within base..%s", MaxBackoff)
	case !(b.Jitter >= 0 && b.Jitter <= 1):
		return fmt.Errorf("jitter must be within 0..1")
	}
	return nil
}

// Retry is how many deliveries topic's items get before they are
// dead-lettered (0: no limit) and how long a nack without a delay waits:
// the topic's own settings where it has them, the namespace's otherwise.
func (ns *Namespace) Retry(topic string) (maxAttempts int, backoff Backoff) {
	tc := ns.Topics[topic]
	maxAttempts, backoff = ns.MaxAttempts, DefaultBackoff
	if tc.MaxAttempts > 0 {
		maxAttempts = tc.MaxAttempts
	}
	if tc.Backoff != nil {
		backoff = *tc.Backoff
	}
	return maxAttempts, backoff
}
