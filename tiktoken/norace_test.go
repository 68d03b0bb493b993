//go:build !race

package tiktoken

// slowdown is how many times slower the build makes the code the time
// bounds measure: 1, without the race detector.
const slowdown = 1
