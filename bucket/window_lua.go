package bucket

// luaWindow defines now, from Redis TIME, and what the fixed-window and
// sliding-log scripts do alike, with num (luaNum):
//
//   - expireAfter(key, at) has key expire a second after at (µs), so that
//     an idle key disappears once nothing it holds counts;
//   - takeBack(r, amounts, set) takes a refund of r off amounts, the
//     newest first (the caller orders them), shrinking the last one it
//     reaches: set(k, a) gives the k-th its new amount a, 0 to delete it;
//   - left(used) is a tokens script's reply: for each KEYS[i], its burst
//     minus used(key, window), as strings (ARGV: one triple per key,
//     window, burst and an unused amount).
const luaWindow = luaNum + `
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local function expireAfter(key, at)
  redis.call('PEXPIRE', key, string.format('%d', math.ceil((at - now) / 1000) + 1000))
end
local function takeBack(r, amounts, set)
  for k, a in ipairs(amounts) do
    if r <= 0 then
      break
    end
    if a <= r then
      set(k, 0)
      r = r - a
    else
      set(k, a - r)
      r = 0
    end
  end
end
local function left(used)
  local out = {}
  for i, key in ipairs(KEYS) do
    local w, burst = tonumber(ARGV[3*i-2]), tonumber(ARGV[3*i-1])
    out[i] = string.format('%.17g', burst - used(key, w))
  end
  return out
end
`
