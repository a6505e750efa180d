package provision

import (
	"context"
	"errors"
	"sync"
	"time"
)

// pollAttempt bounds one attempt of Poll, so that a server that accepts a
// connection and then says nothing costs an attempt, not the whole wait.
const pollAttempt = 5 * time.Second

// Poll calls f until it returns nil, pausing every between attempts, each
// attempt bounded by 5 s. When ctx ends first it returns ctx's error
// joined with f's last one, so the caller can say what was still wrong.
func Poll(ctx context.Context, every time.Duration, f func(context.Context) error) error {
	for {
		actx, cancel := context.WithTimeout(ctx, pollAttempt)
		err := f(actx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.Join(ctx.Err(), err)
		case <-time.After(every):
		}
	}
}

// Parallel runs f(0) to f(n-1) at once, waits for all of them and returns
// their errors joined.
func Parallel(n int, f func(i int) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = f(i) })
	}
	wg.Wait()
	return errors.Join(errs...)
}
