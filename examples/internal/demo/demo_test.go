package demo

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRedisURL(t *testing.T) {
	u, err := RedisURL("127.0.0.1:6379")
	require.NoError(t, err)
	assert.Equal(t, "redis://127.0.0.1:6379", u)

	_, err = RedisURL("redis://user:hunter2@host:port:bad")
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "hunter2", "the error never quotes the URL")

	assert.Equal(t, "redis://user:xxxxx@host:6379", Redacted("redis://user:hunter2@host:6379"))
}
