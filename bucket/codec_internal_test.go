package bucket

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The token bucket scripts read ARGV through the codec's names only: no
// position is written as a number in their source.
func TestTokenBucketScriptsReadARGVByName(t *testing.T) {
	numbered := regexp.MustCompile(`ARGV\[\s*[0-9]|ARGV\[[^\]]*[0-9]\s*\*`)
	for _, file := range []string{"redis_lua.go", "lease.go"} {
		src, err := os.ReadFile(file)
		require.NoError(t, err)
		for i, line := range strings.Split(string(src), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "//") {
				continue // Go's comments speak of ARGV[1] as Lua numbers it
			}
			assert.False(t, numbered.MatchString(line), "%s:%d reads ARGV by a number: %s", file, i+1, line)
		}
	}
}

// withCodec writes each codec name as the value of its Go constant, and
// refuses a name the codec does not have.
func TestWithCodec(t *testing.T) {
	assert.Equal(t, "ARGV[2] ARGV[o + 2] KEYS ARGV", withCodec("ARGV[ARG_SPAN] ARGV[o + DIM_RATE] KEYS ARGV"))
	assert.Equal(t, "x == 1", withCodec("x == KIND_WINDOW"))
	assert.Panics(t, func() { withCodec("ARGV[DIM_RATES]") })
	for _, s := range scripts {
		assert.NotRegexp(t, codecName, s.src, "every name written as its value")
	}
}
