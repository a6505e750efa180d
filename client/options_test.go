package client

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TopicOptions{} is the defaults; negative values ask for none.
func TestTopicOptionsDefaults(t *testing.T) {
	for _, tc := range []struct {
		name     string
		in, want TopicOptions
	}{
		{"zero", TopicOptions{}, TopicOptions{Concurrency: 1, Prefetch: 1, Timeout: DefaultHandlerTimeout}},
		{"prefetch follows concurrency", TopicOptions{Concurrency: 8}, TopicOptions{Concurrency: 8, Prefetch: 8, Timeout: time.Minute}},
		{"no prefetch, no timeout", TopicOptions{Concurrency: 2, Prefetch: -1, Timeout: NoTimeout}, TopicOptions{Concurrency: 2, Prefetch: 0, Timeout: NoTimeout}},
		{"any negative timeout is none", TopicOptions{Timeout: -time.Hour}, TopicOptions{Concurrency: 1, Prefetch: 1, Timeout: NoTimeout}},
		{"explicit", TopicOptions{Concurrency: 3, Prefetch: 5, Timeout: 2 * time.Minute}, TopicOptions{Concurrency: 3, Prefetch: 5, Timeout: 2 * time.Minute}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, tc.in.withDefaults())
		})
	}
	require.Equal(t, time.Minute, DefaultHandlerTimeout)
}
