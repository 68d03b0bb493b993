package bucket

// The fixed-window scripts keep one HASH per key and dimension: field = the
// window's number, floor(time / window), value = the cost counted in it.
// Times are integer microseconds of Redis TIME, exact in a Lua double, and
// written with %d since tostring keeps only 14 digits. Counts are written
// by num (see luaNum). Lua tables are
// keyed by the field strings, not by window numbers: gopher-lua (in
// miniredis) would allocate an array as long as the number. Fields of past
// windows are deleted by the next write; the key expires a second after the
// end of the last window it counts, so idle keys disappear.
//
// ARGV of every script: operation-specific values, then one triple per key:
// window (µs), burst, amount.

// fixedWindowIndex defines index(at, w) = floor(at / w), after luaWindow. The
// division cannot round up to an integer k for integers with at + w < 2^53:
// at/w = k - e with e >= 1/w, while rounding moves a quotient below k by at
// most half an ulp of k, k·2^-53, which is less than 1/w as k·w < at + w.
// Times stay below 2^52 µs until 2112, and windows are at most 2^52 µs.
const fixedWindowIndex = luaWindow + `
local function index(at, w)
  return math.floor(at / w)
end
`

// fixedReserveScript counts each KEYS[i]'s amount in the first window,
// from the current one on, where it fits in every dimension, if that window
// opens within ARGV[1] microseconds: all or nothing. It returns the wait in
// microseconds (0 for the current window, else the time until the window
// opens), negated if nothing was taken.
var fixedReserveScript = newScript(fixedWindowIndex + `
local n = #KEYS
local win, burst, cost, count, old = {}, {}, {}, {}, {}
for i = 1, n do
  win[i], burst[i], cost[i] = tonumber(ARGV[3*i-1]), tonumber(ARGV[3*i]), tonumber(ARGV[3*i+1])
  local cur = index(now, win[i])
  local h = redis.call('HGETALL', KEYS[i])
  local c, o = {}, {}
  for k = 1, #h, 2 do
    if tonumber(h[k]) < cur then
      o[#o+1] = h[k]
    else
      c[h[k]] = tonumber(h[k+1])
    end
  end
  count[i], old[i] = c, o
end
-- The earliest moment, from now on, at which every dimension's window has
-- room. A window that counts nothing has room (amounts are at most the
-- burst), so each pass either stops or moves to the start of a later
-- window that counts something: the loop ends.
local at = now
repeat
  local nxt = at
  for i = 1, n do
    local j = index(at, win[i])
    if (count[i][string.format('%d', j)] or 0) + cost[i] > burst[i] then
      nxt = math.max(nxt, (j + 1) * win[i])
    end
  end
  local moved = nxt > at
  at = nxt
until not moved
local wait = at - now
if wait > tonumber(ARGV[1]) then
  return -wait
end
for i = 1, n do
  local key, w, c = KEYS[i], win[i], count[i]
  if #old[i] > 0 then
    redis.call('HDEL', key, unpack(old[i]))
  end
  local j = index(at, w)
  local f = string.format('%d', j)
  c[f] = (c[f] or 0) + cost[i]
  redis.call('HSET', key, f, num(c[f]))
  local last = j
  for g in pairs(c) do
    last = math.max(last, tonumber(g))
  end
  expireAfter(key, (last + 1) * w)
end
return wait
`)

// fixedAdjustScript adds each KEYS[i]'s amount to the current window; a
// negative amount is taken off the latest windows first, down to the
// current one, never below zero. ARGV has only the triples.
var fixedAdjustScript = newScript(fixedWindowIndex + `
for i, key in ipairs(KEYS) do
  local w, delta = tonumber(ARGV[3*i-2]), tonumber(ARGV[3*i])
  local cur = index(now, w)
  local h = redis.call('HGETALL', key)
  local count, fields, old = {}, {}, {}
  for k = 1, #h, 2 do
    if tonumber(h[k]) < cur then
      old[#old+1] = h[k]
    else
      count[h[k]] = tonumber(h[k+1])
      fields[#fields+1] = h[k]
    end
  end
  if #old > 0 then
    redis.call('HDEL', key, unpack(old))
  end
  if delta > 0 then
    local f = string.format('%d', cur)
    count[f] = (count[f] or 0) + delta
    redis.call('HSET', key, f, num(count[f]))
  else
    table.sort(fields, function(a, b) return tonumber(a) > tonumber(b) end)
    local amounts = {}
    for k, f in ipairs(fields) do
      amounts[k] = count[f]
    end
    takeBack(-delta, amounts, function(k, a)
      local f = fields[k]
      if a == 0 then
        redis.call('HDEL', key, f)
        count[f] = nil
      else
        count[f] = a
        redis.call('HSET', key, f, num(a))
      end
    end)
  end
  local last
  for f in pairs(count) do
    last = math.max(last or tonumber(f), tonumber(f))
  end
  if last then
    expireAfter(key, (last + 1) * w)
  end
end
return 1
`)

// fixedTokensScript returns what is left of each KEYS[i]'s current window,
// burst minus its count, as strings, changing nothing. ARGV has only the
// triples; the amounts are unused.
var fixedTokensScript = newScript(fixedWindowIndex + `
return left(function(key, w)
  local c = redis.call('HGET', key, string.format('%d', index(now, w)))
  return c and tonumber(c) or 0
end)
`)
