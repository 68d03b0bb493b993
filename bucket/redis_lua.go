package bucket

import "github.com/redis/go-redis/v9"

// The scripts keep one HASH per key and dimension:
//
//	t   tokens in millionths (an integer), negative while in debt
//	ts  when t was last refilled, in microseconds of Redis TIME
//	x   when the key is set to expire, in microseconds
//
// Times are integer microseconds: exact in a Lua double, and passed to
// redis.call as numbers, which Redis writes with 17 digits (never through
// tostring or "..", which keep only 14). Tokens are stored as integer
// millionths too, rounded to the nearest: a fraction could be written in
// exponent form ("2e-06"), which gopher-lua (miniredis) cannot read back. A key must outlive its refill (and
// debt): a key that vanished early would come back full. The expiry is
// pushed out only when that need passes x, and then past it by one more
// refill time (1 to 60 s), so a hot key does not pay a PEXPIREAT per call,
// and an idle key disappears soon after it is full again.
//
// ARGV of every script: ARGV[1] is operation-specific, then one triple per
// key: rate (tokens/s), burst, amount.

// luaRefill reads KEYS[i] into tk (tokens now, refilled and clamped) and x.
const luaRefill = `
  local rate, burst, amount = tonumber(ARGV[3*i-1]), tonumber(ARGV[3*i]), tonumber(ARGV[3*i+1])
  local s = redis.call('HMGET', key, 't', 'ts', 'x')
  local tk, x = burst, 0
  if s[1] then
    tk = math.min(burst, (tonumber(s[1]) + math.max(0, now - tonumber(s[2])) * rate) / 1e6)
    x = tonumber(s[3]) or 0
  end
`

// luaStore writes tk for KEYS[i] at now, extending its expiry if needed.
const luaStore = `
  local full = now + math.ceil((burst - tk) * 1e6 / rate) + 1e6
  if full > x then
    x = full + math.ceil(math.min(math.max(burst * 1e6 / rate, 1e6), 6e7))
    redis.call('HSET', key, 't', math.floor(tk * 1e6 + 0.5), 'ts', now, 'x', x)
    redis.call('PEXPIREAT', key, math.ceil(x / 1000))
  else
    redis.call('HSET', key, 't', math.floor(tk * 1e6 + 0.5), 'ts', now)
  end
`

// luaNum defines num(x): x as a string with no exponent (gopher-lua, in
// miniredis, cannot read "1e-07" back): whole numbers exactly, others to
// the millionth.
const luaNum = `
local function num(x)
  if x == math.floor(x) then
    return string.format('%d', x)
  end
  local s = string.gsub(string.format('%.6f', x), '%.?0+$', '')
  return s
end
`

const luaNow = `
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
`

// reserveScript takes each KEYS[i]'s amount if all of them can be taken
// within ARGV[1] microseconds, all or nothing. It returns the wait in
// microseconds (0 if the tokens were there), negated if nothing was taken
// (a refused wait is always > 0).
var reserveScript = redis.NewScript(luaNow + `
local left, exp, wait = {}, {}, 0
for i, key in ipairs(KEYS) do` + luaRefill + `
  tk = tk - amount
  left[i], exp[i] = tk, x
  if tk < 0 then
    wait = math.max(wait, math.ceil(-tk * 1e6 / rate))
  end
end
if wait > tonumber(ARGV[1]) then
  return -wait
end
for i, key in ipairs(KEYS) do
  local rate, burst, tk, x = tonumber(ARGV[3*i-1]), tonumber(ARGV[3*i]), left[i], exp[i]` + luaStore + `
end
return wait
`)

// adjustScript refills each KEYS[i], then subtracts its amount (a negative
// amount refunds, never above burst). ARGV[1] is unused.
var adjustScript = redis.NewScript(luaNow + `
for i, key in ipairs(KEYS) do` + luaRefill + `
  tk = math.min(burst, tk - amount)
  if tk < burst then` + luaStore + `
  else
    redis.call('DEL', key)
  end
end
return 1
`)

// tokensScript returns each KEYS[i]'s tokens now, as strings, changing
// nothing. ARGV[1] and the amounts are unused.
var tokensScript = redis.NewScript(luaNow + `
local out = {}
for i, key in ipairs(KEYS) do` + luaRefill + `
  out[i] = string.format('%.17g', tk)
end
return out
`)
