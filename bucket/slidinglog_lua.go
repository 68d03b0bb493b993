package bucket

// The sliding-log scripts keep one SORTED SET per key and dimension: one
// entry per admission, scored by its moment in integer microseconds of Redis
// TIME (exact in a double, written with %d since tostring keeps only 14
// digits), member "<id>:<amount>" with id unique per call (a shrunk amount
// is written by num, see luaNum). An entry counts
// while now - window < score: older ones are removed by every write, and the
// key expires a second after its newest entry stops counting, so idle keys
// disappear.
//
// ARGV of every script: operation-specific values, then one triple per key:
// window (µs), burst, amount.

// slidingLogHead parses members and expires keys, after luaWindow.
const slidingLogHead = luaWindow + `
-- A member is "<id>:<amount>"; ids have no colon.
local function amount(member)
  return tonumber(string.sub(member, string.find(member, ':', 1, true) + 1))
end
local function expire(key, w)
  local top = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if top[2] then
    expireAfter(key, tonumber(top[2]) + w)
  end
end
`

// slidingReserveScript adds an entry for each KEYS[i]'s amount at the
// earliest moment, from now on, that keeps every window within its burst in
// every dimension, if that moment is within ARGV[1] microseconds: all or
// nothing. ARGV[2] is the id of the entries. It returns the wait in
// microseconds (0 if the entry is for now), negated if nothing was taken.
//
// With the entries that still count, e_1..e_m in order of score, and A_k
// the sum of the amounts of e_{k+1}..e_m, a cost c is admitted at now if
// A_0 + c <= burst, else at s = score(e_k) + window for the first k with
// A_k + c <= burst (such a k exists: A_m = 0 and c <= burst), or at any
// later moment. Why no window (x - window, x] ever holds more than burst:
// only windows containing s change, and they hold only entries scored above
// s - window >= score(e_k) (or above now - window), that is among
// e_{k+1}..e_m (or e_1..e_m) plus the new one: at most A_k + c <= burst.
// With entries all in the past the moment is also the earliest possible;
// entries reserved in the future are counted as if present, which only
// queues later callers behind them.
var slidingReserveScript = newScript(slidingLogHead + `
local at = now
local last = {}
for i, key in ipairs(KEYS) do
  local w, burst, cost = tonumber(ARGV[3*i]), tonumber(ARGV[3*i+1]), tonumber(ARGV[3*i+2])
  redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now - w))
  local e = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
  local m = #e / 2
  local after = {[m] = 0}
  for k = m, 1, -1 do
    after[k-1] = after[k] + amount(e[2*k-1])
  end
  if after[0] + cost > burst then
    for k = 1, m do
      if after[k] + cost <= burst then
        at = math.max(at, tonumber(e[2*k]) + w)
        break
      end
    end
  end
  last[i] = m > 0 and tonumber(e[2*m]) or now
end
local wait = at - now
if wait > tonumber(ARGV[1]) then
  return -wait
end
local score = string.format('%d', at)
for i, key in ipairs(KEYS) do
  local w = tonumber(ARGV[3*i])
  redis.call('ZADD', key, score, ARGV[2] .. ':' .. ARGV[3*i+2])
  expireAfter(key, math.max(last[i], at) + w)
end
return wait
`)

// slidingAdjustScript adds an entry for each KEYS[i]'s amount at now, id
// ARGV[1]; a negative amount is taken off the newest entries first,
// shrinking the last one it reaches. It returns 1.
var slidingAdjustScript = newScript(slidingLogHead + `
for i, key in ipairs(KEYS) do
  local w, delta = tonumber(ARGV[3*i-1]), tonumber(ARGV[3*i+1])
  redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now - w))
  if delta > 0 then
    redis.call('ZADD', key, string.format('%d', now), ARGV[1] .. ':' .. ARGV[3*i+1])
  else
    local e = redis.call('ZREVRANGE', key, 0, -1, 'WITHSCORES')
    local amounts = {}
    for k = 1, #e / 2 do
      amounts[k] = amount(e[2*k-1])
    end
    takeBack(-delta, amounts, function(k, a)
      local member = e[2*k-1]
      redis.call('ZREM', key, member)
      if a > 0 then
        local id = string.sub(member, 1, string.find(member, ':', 1, true) - 1)
        redis.call('ZADD', key, string.format('%d', tonumber(e[2*k])), id .. ':' .. num(a))
      end
    end)
  end
  expire(key, w)
end
return 1
`)

// slidingTokensScript returns each KEYS[i]'s burst minus the amounts of its
// entries that count now (future ones included), as strings, changing
// nothing. ARGV has only the triples; the amounts are unused.
var slidingTokensScript = newScript(slidingLogHead + `
return left(function(key, w)
  local sum = 0
  for _, member in ipairs(redis.call('ZRANGEBYSCORE', key, '(' .. string.format('%d', now - w), '+inf')) do
    sum = sum + amount(member)
  end
  return sum
end)
`)
