package bucket

// The in-flight scripts keep three sorted sets per key, all in the key's
// hash slot:
//
//	KEYS[1] <prefix>:{<key>}/inflight          the holders: member → lease end
//	KEYS[2] <prefix>:{<key>}/inflight/queue    the waiters: member → when queued
//	KEYS[3] <prefix>:{<key>}/inflight/waiting  the waiters: member → lease end
//
// A member is "<pid>.<instance>/<seq>": the process and InFlight that holds
// or waits, and which call. Times are integer microseconds of Redis TIME,
// passed to redis.call as numbers (written with 17 digits: exact). A '/'
// after the brace keeps these names apart from a token bucket's, which put
// ':' there.
//
// Every script first drops the members whose lease has ended (purge), then
// hands the free slots to the head of the queue (grant), a holder's lease
// being the one its waiter had, and tells each granted waiter's process on
// its channel, ARGV[2] .. "<pid>.<instance>", with "<member> <KEYS[1]>".
// Then each key expires a second after the last lease it holds ends, so
// that an idle key disappears (finish).
//
// A server that started less than a renewal ago (a third of the lease,
// rounded up to whole seconds, and a second more: its INFO counts whole
// seconds) may have lost its holders to a restart: their processes hold
// them still, and state them again at their next renewal. Until then it
// grants no slot, neither at once nor from the queue (restarting): a slot
// it gave would be one more than n. A waiter's process calls again when
// that ends (sweep).
//
// ARGV of every script: n (the limit), the channel prefix, the lease (µs),
// then the operation's arguments. Each is bounded in Go first: n in
// [1, maxInFlight], the lease in [minLease, maxLease], members of a few
// dozen bytes.
const luaFlight = `
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local n, chan, lease = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local H, Q, W = KEYS[1], KEYS[2], KEYS[3]

-- restarting returns how long, in µs, the server still grants no slot
-- after its start (see above); 0 once it does, or if it does not say
-- when it started. It asks at most once per script.
local restart
local function restarting()
  if not restart then
    restart = 0
    local info = redis.pcall('INFO', 'server')
    local up = type(info) == 'string' and tonumber(string.match(info, 'uptime_in_seconds:(%d+)'))
    if up then
      restart = math.max(0, (math.ceil(lease / 3e6) + 1 - up) * 1e6)
    end
  end
  return restart
end

local function purge()
  redis.call('ZREMRANGEBYSCORE', H, '-inf', now)
  local gone = redis.call('ZRANGEBYSCORE', W, '-inf', now)
  for _, m in ipairs(gone) do
    redis.call('ZREM', Q, m)
  end
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', W, '-inf', now)
  end
end

local function grant()
  local free = n - redis.call('ZCARD', H)
  if free <= 0 or restarting() > 0 then
    return
  end
  for _, m in ipairs(redis.call('ZRANGE', Q, 0, free - 1)) do
    local u = redis.call('ZSCORE', W, m) or (now + lease)
    redis.call('ZREM', Q, m)
    redis.call('ZREM', W, m)
    redis.call('ZADD', H, u, m)
    local inst = string.match(m, '^(.*)/')
    if inst then
      -- pcall: a user who may not publish (an ACL without the channel)
      -- must not leave the grant half made; its SUBSCRIBE says so.
      redis.pcall('PUBLISH', chan .. inst, m .. ' ' .. H)
    end
  end
end

-- sweep is how long until the first holder's lease ends, or the server
-- grants slots again after its start if that is sooner, in µs, while
-- someone waits (0 if nobody does): a waiting process calls then, and the
-- slot of a holder that died goes to the queue on time.
local function sweep()
  if redis.call('ZCARD', Q) == 0 then
    return 0
  end
  local s = restarting()
  local h = redis.call('ZRANGE', H, 0, 0, 'WITHSCORES')
  if h[2] and (s == 0 or tonumber(h[2]) - now < s) then
    s = math.max(tonumber(h[2]) - now, 1)
  end
  return s
end

local function finish()
  local last = now
  for _, k in ipairs({H, W}) do
    local s = redis.call('ZRANGE', k, -1, -1, 'WITHSCORES')
    if s[2] then
      last = math.max(last, tonumber(s[2]))
    end
  end
  local ms = math.ceil((last - now) / 1000) + 1000
  for _, k in ipairs(KEYS) do
    redis.call('PEXPIRE', k, ms)
  end
end
`

// flightAcquireScript takes a slot for member ARGV[4] if one is free and
// nobody is queued before it; else, if ARGV[5] is 1, queues it (a member
// already queued keeps its place). It replies {1, 0} if the member holds a
// slot, else {0, sweep}.
var flightAcquireScript = newScript(luaFlight + `
local m = ARGV[4]
purge()
grant()
local held = redis.call('ZSCORE', H, m)
if not held and not redis.call('ZSCORE', W, m) then
  if redis.call('ZCARD', Q) == 0 and redis.call('ZCARD', H) < n and restarting() == 0 then
    redis.call('ZADD', H, now + lease, m)
    held = true
  elseif ARGV[5] == '1' then
    redis.call('ZADD', Q, now, m)
    redis.call('ZADD', W, now + lease, m)
  end
end
local s = 0
if not held then
  s = sweep()
end
finish()
if held then
  return {1, 0}
end
return {0, s}
`)

// flightLeaveScript removes members ARGV[4...] wherever they are: a holder
// releases its slot, a waiter leaves the queue. The freed slots go to the
// queue's head. It replies with the number of slots freed.
var flightLeaveScript = newScript(luaFlight + `
local freed = 0
for i = 4, #ARGV do
  freed = freed + redis.call('ZREM', H, ARGV[i])
  redis.call('ZREM', Q, ARGV[i])
  redis.call('ZREM', W, ARGV[i])
end
purge()
grant()
finish()
return freed
`)

// flightRenewScript renews the leases of one process's members of the key,
// ARGV[4] holders "h" then "w" waiters, named in ARGV[5...]: a holder's slot
// is held on for a lease from now, added again if its lease had ended (the
// call is still in flight; Redis must count it, even past n); a waiter's
// place is kept, or, lost, taken again at the back of the queue. It
// replies with 1 for each waiter that holds a slot now, 0 for one that
// still waits, in order, then the sweep.
var flightRenewScript = newScript(luaFlight + `
local holders = tonumber(ARGV[4])
purge()
for i = 5, 4 + holders do
  redis.call('ZADD', H, now + lease, ARGV[i])
end
for i = 5 + holders, #ARGV do
  local m = ARGV[i]
  if redis.call('ZSCORE', H, m) then
    redis.call('ZADD', H, now + lease, m)
  else
    if not redis.call('ZSCORE', W, m) then
      redis.call('ZADD', Q, now, m)
    end
    redis.call('ZADD', W, now + lease, m)
  end
end
grant()
local out = {}
for i = 5 + holders, #ARGV do
  if redis.call('ZSCORE', H, ARGV[i]) then
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
out[#out + 1] = sweep()
finish()
return out
`)

// flightHeldScript replies with the number of slots held whose lease has not
// ended. It writes nothing.
var flightHeldScript = newScript(luaFlight + `
return redis.call('ZCOUNT', H, '(' .. string.format('%d', now), '+inf')
`)
