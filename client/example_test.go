package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/triage-queue/triage/client"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

// exampleRouter starts a local one-router bed (real MariaDB and NATS) for
// an example and returns its address and a function that stops it. In
// real code the address is your router's, e.g. 127.0.0.1:9090.
func exampleRouter() (string, func()) {
	b, err := startBed("example", bedOpts{})
	if err != nil {
		panic(err)
	}
	return b.Addr, b.Stop
}

// A worker with a typed handler: the payloads are JSON, each handled once
// and acked when the handler returns nil.
func Example_worker() {
	addr, stop := exampleRouter()
	defer stop()
	ctx := context.Background()

	c, err := client.Dial(ctx, addr)
	if err != nil {
		panic(err)
	}
	defer c.Close()
	for _, name := range []string{"ada", "grace", "edsger"} {
		if _, err := c.Enqueue(ctx, "default", "welcome", &triagev1.NewItem{Payload: fmt.Appendf(nil, `{"name":%q}`, name)}); err != nil {
			panic(err)
		}
	}

	w, err := client.NewWorker(c, client.WorkerConfig{Namespace: "default", Wait: time.Second})
	if err != nil {
		panic(err)
	}
	type welcome struct {
		Name string `json:"name"`
	}
	done := make(chan struct{}, 3)
	client.HandleJSON(w, "welcome", func(ctx context.Context, it *client.Item, m welcome) error {
		fmt.Println("welcome,", m.Name)
		done <- struct{}{}
		return nil
	}, client.TopicOptions{})
	if err := w.Start(ctx); err != nil {
		panic(err)
	}
	for range 3 {
		<-done
	}
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := w.Stop(stopCtx); err != nil {
		panic(err)
	}
	// Output:
	// welcome, ada
	// welcome, grace
	// welcome, edsger
}

// Middleware sees every item and its result: here a log line per item,
// the place for metrics and tracing spans too.
func ExampleWorker_Use() {
	addr, stop := exampleRouter()
	defer stop()
	ctx := context.Background()
	c, err := client.Dial(ctx, addr)
	if err != nil {
		panic(err)
	}
	defer c.Close()
	if _, err := c.Enqueue(ctx, "default", "resize", &triagev1.NewItem{Payload: []byte("cat.png")}); err != nil {
		panic(err)
	}

	w, err := client.NewWorker(c, client.WorkerConfig{Namespace: "default", Wait: time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		panic(err)
	}
	done := make(chan struct{})
	w.Use(func(next client.Handler) client.Handler {
		return func(ctx context.Context, it *client.Item) error {
			err := next(ctx, it)
			fmt.Printf("topic=%s payload=%s attempt=%d err=%v\n", it.Topic, it.Payload, it.Attempts, err)
			close(done)
			return err
		}
	})
	w.Handle("resize", func(ctx context.Context, it *client.Item) error { return nil }, client.TopicOptions{})
	if err := w.Start(ctx); err != nil {
		panic(err)
	}
	<-done
	if err := w.Stop(ctx); err != nil {
		panic(err)
	}
	// Output:
	// topic=resize payload=cat.png attempt=1 err=<nil>
}

// A permanent error sends the item to the dead letters at once, however
// many attempts it has left.
func ExamplePermanent() {
	addr, stop := exampleRouter()
	defer stop()
	ctx := context.Background()
	c, err := client.Dial(ctx, addr)
	if err != nil {
		panic(err)
	}
	defer c.Close()
	if _, err := c.Enqueue(ctx, "default", "charge", &triagev1.NewItem{Payload: []byte("card-expired")}); err != nil {
		panic(err)
	}

	w, err := client.NewWorker(c, client.WorkerConfig{Namespace: "default", Wait: time.Second})
	if err != nil {
		panic(err)
	}
	w.Handle("charge", func(ctx context.Context, it *client.Item) error {
		return client.Permanent(errors.New("card expired; retrying will not help"))
	}, client.TopicOptions{})
	if err := w.Start(ctx); err != nil {
		panic(err)
	}
	var dead []*triagev1.DeadLetter
	for len(dead) == 0 {
		time.Sleep(20 * time.Millisecond)
		resp, err := c.Queue.ListDeadLetters(ctx, &triagev1.ListDeadLettersRequest{Namespace: "default", Topic: "charge"})
		if err != nil {
			panic(err)
		}
		dead = resp.DeadLetters
	}
	if err := w.Stop(ctx); err != nil {
		panic(err)
	}
	fmt.Printf("%s: %s (attempts: %d)\n", dead[0].Payload, dead[0].LastError, dead[0].Attempts)
	// Output:
	// card-expired: permanent: card expired; retrying will not help (attempts: 1)
}

// Several routers, the local region's first; a call that finds a router
// down moves on to the next at once.
func ExampleDialEndpoints() {
	ctx := context.Background()
	c, err := client.DialEndpoints(ctx, []client.Endpoint{
		{Addr: "10.0.1.10:9090", Region: "us-east"},
		{Addr: "10.0.2.10:9090", Region: "eu-west"},
		{Addr: "10.0.1.11:9090", Region: "us-east"},
	}, client.WithRegion("eu-west"))
	if err != nil {
		panic(err)
	}
	defer c.Close()
	// Use c as usual: eu-west's router first, then the us-east ones.
}

// Options per topic: thumbnails eight at a time with two minutes each,
// exports without a timeout (they report their own progress), emails with
// the defaults (one at a time, one minute). A handler past its timeout
// sees its context cancelled with cause ErrHandlerTimeout, and its item
// is nacked with the server's backoff.
func ExampleTopicOptions() {
	ctx := context.Background()
	c, err := client.Dial(ctx, "127.0.0.1:9090")
	if err != nil {
		panic(err)
	}
	defer c.Close()
	w, err := client.NewWorker(c, client.WorkerConfig{Namespace: "default"})
	if err != nil {
		panic(err)
	}
	w.Handle("thumbnails", func(ctx context.Context, it *client.Item) error {
		return nil // resize it.Payload
	}, client.TopicOptions{Concurrency: 8, Timeout: 2 * time.Minute})
	w.Handle("exports", func(ctx context.Context, it *client.Item) error {
		return nil // a long export, watched by its own progress reports
	}, client.TopicOptions{Timeout: client.NoTimeout})
	w.Handle("emails", func(ctx context.Context, it *client.Item) error {
		err := sendMail(ctx, it.Payload)
		if errors.Is(context.Cause(ctx), client.ErrHandlerTimeout) {
			// Too late: the worker has nacked the item already and
			// ignores what this returns.
			slog.Warn("mail server too slow", "id", it.ID)
		}
		return err
	}, client.TopicOptions{})
	_ = w.Run(ctx) // until ctx is done
}

// sendMail stands in for a call that honours its context.
func sendMail(ctx context.Context, _ []byte) error { return ctx.Err() }
