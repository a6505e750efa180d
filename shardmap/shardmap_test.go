package shardmap

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const twoShards = `{"version":1,"regions":["us-east","eu-west"],
 "shards":[{"id":1,"home_region":"us-east","primary":"127.0.0.1:3307"},{"id":2,"home_region":"us-east","primary":"127.0.0.1:3308"},
           {"id":3,"home_region":"eu-west","primary":"127.0.0.1:3309","replicas":["127.0.0.1:3310"]}],
 "namespaces":[{"name":"default"},{"name":"pinned","shards":{"us-east":[2]},"default_lease_duration":"1m"}]}`

func TestParseAndResolve(t *testing.T) {
	t.Parallel()
	m, err := Parse([]byte(twoShards))
	require.NoError(t, err)
	ids, err := m.ShardsFor("default", "us-east")
	require.NoError(t, err)
	require.Equal(t, []uint32{1, 2}, ids)
	ids, err = m.ShardsFor("pinned", "us-east")
	require.NoError(t, err)
	require.Equal(t, []uint32{2}, ids)
	ids, err = m.ShardsFor("pinned", "eu-west")
	require.NoError(t, err)
	require.Equal(t, []uint32{3}, ids)
	_, err = m.ShardsFor("nope", "us-east")
	require.ErrorIs(t, err, ErrUnknownNamespace)
	_, err = m.ShardsFor("default", "mars")
	require.ErrorIs(t, err, ErrNoShards)
	ns, err := m.Namespace("pinned")
	require.NoError(t, err)
	require.Equal(t, time.Minute, time.Duration(ns.DefaultLeaseDuration))
	require.Equal(t, DefaultMaxPayloadBytes, ns.MaxPayloadBytes)
	s, ok := m.Shard(1)
	require.True(t, ok)
	require.Equal(t, "triage", s.Database)

	// A marshalled map parses back to the same content.
	data, err := m.Marshal()
	require.NoError(t, err)
	again, err := Parse(data)
	require.NoError(t, err)
	require.Equal(t, m.Shards, again.Shards)
	require.Equal(t, m.Namespaces, again.Namespaces)
}

func TestParseRejects(t *testing.T) {
	t.Parallel()
	for name, doc := range map[string]string{
		"no regions":      `{"version":1}`,
		"bad home":        `{"regions":["a"],"shards":[{"id":1,"home_region":"b","primary":"x:1"}]}`,
		"dup shard":       `{"regions":["a"],"shards":[{"id":1,"home_region":"a","primary":"x:1"},{"id":1,"home_region":"a","primary":"x:2"}]}`,
		"no primary":      `{"regions":["a"],"shards":[{"id":1,"home_region":"a"}]}`,
		"unknown shard":   `{"regions":["a"],"namespaces":[{"name":"n","shards":{"a":[9]}}]}`,
		"bad name":        `{"regions":["a"],"namespaces":[{"name":"has space"}]}`,
		"bad duration":    `{"regions":["a"],"namespaces":[{"name":"n","default_lease_duration":"soon"}]}`,
		"lease too short": `{"regions":["a"],"namespaces":[{"name":"n","default_lease_duration":"1ms"}]}`,
		"not json":        `{`,
	} {
		_, err := Parse([]byte(doc))
		require.Error(t, err, name)
	}
}

func TestHolderOffersOnlyNewer(t *testing.T) {
	t.Parallel()
	m1, err := Parse([]byte(twoShards))
	require.NoError(t, err)
	h := NewHolder(m1)
	m0 := *m1
	m0.Version = 0
	require.False(t, h.Offer(&m0))
	m2 := *m1
	m2.Version = 2
	require.True(t, h.Offer(&m2))
	require.Equal(t, uint64(2), h.Current().Version)
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(twoShards))
	f.Add([]byte(`{"regions":["a"]}`))
	f.Add([]byte(`{"regions":["a"],"namespaces":[{"name":"n","shards":{"a":[]}}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Parse(data)
		if err != nil {
			return
		}
		// A valid map survives a round trip.
		out, err := m.Marshal()
		require.NoError(t, err)
		_, err = Parse(out)
		require.NoError(t, err)
	})
}
