package bucket

import "github.com/redis/go-redis/v9"

// The scripts keep one HASH per key and dimension: t = tokens (negative in
// debt), ts = when t was last refilled, in microseconds of Redis TIME. Every
// time is an integer number of microseconds: exact in a Lua double, and
// written with %d since tostring keeps only 14 digits. A key expires once it
// would have refilled completely, so idle keys disappear.
//
// ARGV of every script: ARGV[1] is operation-specific, then one triple per
// key: rate (tokens/s), burst, amount.

// reserveScript takes each KEYS[i]'s amount if all of them can be taken
// within ARGV[1] microseconds, all or nothing. It returns {1, wait} when
// taken (wait is 0 if the tokens were there) or {0, wait} when not.
var reserveScript = redis.NewScript(`
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local left, wait = {}, 0
for i, key in ipairs(KEYS) do
  local rate, burst, cost = tonumber(ARGV[3*i-1]), tonumber(ARGV[3*i]), tonumber(ARGV[3*i+1])
  local s = redis.call('HMGET', key, 't', 'ts')
  local tk = burst
  if s[1] then
    tk = math.min(burst, tonumber(s[1]) + math.max(0, now - tonumber(s[2])) * rate / 1e6)
  end
  tk = tk - cost
  left[i] = tk
  if tk < 0 then
    wait = math.max(wait, math.ceil(-tk * 1e6 / rate))
  end
end
if wait > tonumber(ARGV[1]) then
  return {0, wait}
end
local ts = string.format('%d', now)
for i, key in ipairs(KEYS) do
  local rate, burst = tonumber(ARGV[3*i-1]), tonumber(ARGV[3*i])
  redis.call('HSET', key, 't', left[i], 'ts', ts)
  redis.call('PEXPIRE', key, math.ceil((burst - left[i]) * 1000 / rate) + 1000)
end
return {1, wait}
`)

// adjustScript refills each KEYS[i], then subtracts its amount (a negative
// amount refunds, never above burst). ARGV[1] is unused.
var adjustScript = redis.NewScript(`
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local ts = string.format('%d', now)
for i, key in ipairs(KEYS) do
  local rate, burst, delta = tonumber(ARGV[3*i-1]), tonumber(ARGV[3*i]), tonumber(ARGV[3*i+1])
  local s = redis.call('HMGET', key, 't', 'ts')
  local tk = burst
  if s[1] then
    tk = math.min(burst, tonumber(s[1]) + math.max(0, now - tonumber(s[2])) * rate / 1e6)
  end
  tk = math.min(burst, tk - delta)
  if tk < burst then
    redis.call('HSET', key, 't', tk, 'ts', ts)
    redis.call('PEXPIRE', key, math.ceil((burst - tk) * 1000 / rate) + 1000)
  else
    redis.call('DEL', key)
  end
end
return 1
`)

// tokensScript returns each KEYS[i]'s tokens now, as strings, changing
// nothing. ARGV[1] and the amounts are unused.
var tokensScript = redis.NewScript(`
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local out = {}
for i, key in ipairs(KEYS) do
  local rate, burst = tonumber(ARGV[3*i-1]), tonumber(ARGV[3*i])
  local s = redis.call('HMGET', key, 't', 'ts')
  local tk = burst
  if s[1] then
    tk = math.min(burst, tonumber(s[1]) + math.max(0, now - tonumber(s[2])) * rate / 1e6)
  end
  out[i] = string.format('%.17g', tk)
end
return out
`)
