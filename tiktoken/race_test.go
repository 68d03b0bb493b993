//go:build race

package tiktoken

// slowdown is how many times slower the race detector makes the code the
// time bounds measure (it costs 5 to 10 times in CPU).
const slowdown = 10
