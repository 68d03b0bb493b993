package bucket

// The token bucket scripts keep one HASH per key and dimension:
//
//	t   tokens in millionths (an integer), negative while in debt
//	ts  the time t is as of, in microseconds of Redis TIME; in the future
//	    while the key is paused (t is then at most 0)
//	x   when the hash is set to expire, in microseconds
//	r   the rate the provider reported, in millionths per second (optional)
//	b   the burst the provider reported, in millionths (optional)
//	rx  until when r and b count, in microseconds (with r or b)
//	p   the provider's tokens in millionths, as of ts: its bucket, at r up
//	    to b (with r and b, when a report gave its remaining)
//	cr  the lowest rate a process of the fleet is configured with, in
//	    millionths per second, until crx (microseconds); cb, cbx the same
//	    of the burst, in millionths (see pinned)
//	f   the credit of t: in millionths, what has been added to t other than
//	    by time, net of what has been taken other than by reservations:
//	    the refunds of calls served (adjust, served), less every debit and
//	    every cut that a report or a pause made (optional: 0)
//	fp  the same of p (optional: 0)
//	i   the hash's life: the time the hash was made, in microseconds,
//	    raised when p is seeded anew (its credit starts again) or the
//	    credits start again from 0 (optional: 0)
//
// A reservation's waiter moves up by the credit given since it reserved
// (see place in bucket.go): what a served call gave back is capacity that
// every reservation still waiting had counted as taken.
//
// and one HASH per key, KEYS[1], for what the adaptive law needs:
//
//	e   the epoch: how many decreases so far
//	a   the fraction of the ceiling just after the last decrease, in millionths
//	d   when the last decrease happened, in microseconds
//	c   refusals counted toward the next decrease
//	cs  when that count began, in microseconds, moved on by the pauses since
//	p   when the last pause ends, in microseconds
//
// Times are integer microseconds: exact in a Lua double, and passed to
// redis.call as numbers, which Redis writes with 17 digits (never through
// tostring or "..", which keep only 14). Fractions are stored as integer
// millionths: a fraction could be written in exponent form ("2e-06"), which
// gopher-lua (miniredis) cannot read back. A key must outlive its refill,
// debt and pause (a key that vanished early would come back full), and the
// adaptive state its recovery. The expiry is pushed out only when that need
// passes x, and then past it by one more refill time (1 to 60 s), so a hot
// key does not pay a PEXPIREAT per call, and an idle key disappears soon
// after it is full again; a window (WithWindow), two of its lengths after
// its last write (see store).
//
// A dimension's ts lies in the future only while a pause holds the key, and
// never later than p. A ts later than that, or a p later than a pause can
// last (span), means the server's clock has stepped back (a failover to a
// replica whose clock lags): the time is taken as now, so a step back
// delays no call, unless it comes during a pause, and then by at most span.
// A decrease dated in the future is forgotten for the same reason.
//
// Every number the scripts get is bounded in Go first (Limit.Validate, the
// reports and pauses of adaptation), so that no time or amount they compute
// leaves the integers a Lua double holds exactly, and no write can fail
// halfway through a script.
//
// ARGV of reserve, adjust and tokens: the operation's argument, the recovery
// span in microseconds, the law's flags (the recovery law, 0 cubic or 1
// additive, plus 2 for a cold start), then one triple per dimension key:
// rate (tokens/s; negated for a window, WithWindow), burst, amount.

// luaCommon defines now and the functions every token bucket script uses.
const luaCommon = `
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local span, flags = tonumber(ARGV[2]), tonumber(ARGV[3])
local law, cold = flags % 2, flags >= 2
local pausedTo = now -- the latest a dimension's ts may be (see above)
local held = false -- a dimension is held below this process's limit (see pinned)
local pinLive = false -- a dimension read has a pin that holds (see pinned)
local pinIgnored = false -- a dimension read has a pin too far from this process's limit to count (see pinOne)
local pinEnds = {} -- by dimension key, when the pin that holds it lapses, if one does (see place)
local folds = {} -- by dimension key, a report's end refill folded and store is to write (see fold)
local exacts = {} -- by dimension key, true for a window (WithWindow), as refill read it

-- In a batch (see reserveScript), a dimension's fields, as refill reads
-- them (HMGET), are kept for the rest of the script, by dimension key, and
-- follow what store and fold write of them: the reservations after the
-- first read no hash, and what store writes goes to Redis once, at the
-- batch's end (flush). A kept field i that store wrote has i + 100 set:
-- 101 t and ts, 103 x (and the expiry), 107 p, 108 cr and crx, 110 cb and
-- cbx. Elsewhere read is nil: a script that reads a key once keeps
-- nothing, and store writes at once.
local read

-- pinOne is pinned's of one limit: own, or v while it holds (until vx,
-- returned then), adding to pin (made if nil) the fields f and fx to
-- write, if any. A pin more than maxPinRatio times below or above own is
-- a configuration error (a unit or a typo: no rollout changes a limit so
-- far), not a limit: it does not count for this process, which neither
-- keeps to it nor refrains from writing its own, and says so (pinIgnored:
-- logged at error level), so that one absurd process cannot stall the
-- fleet.
local maxPinRatio = 1000
local function pinOne(pin, v, vx, own, f, fx, hold)
  local u = math.floor(own * 1e6 + 0.5)
  v, vx = tonumber(v), tonumber(vx)
  if v and vx and vx > now then
    if u > v * maxPinRatio or v > u * maxPinRatio then
      pinIgnored = true
    else
      pinLive = true
      if u > v then
        held = true
        return v / 1e6, pin, vx
      end
      if u == v and vx - now >= hold / 2 then
        return own, pin -- refreshed by another not long ago
      end
    end
  end
  pin = pin or {}
  local n = #pin
  pin[n+1], pin[n+2], pin[n+3], pin[n+4] = f, u, fx, now + hold
  return own, pin
end

-- pinned returns the rate and burst a dimension has: this process's own,
-- or lower ones that another process of the fleet has used within a hold
-- (the limit's refill time, 1 to 60 s): cr until crx, cb until cbx, each
-- the lowest in use. So processes whose limits disagree never mix them:
-- the lowest holds for all until no process has used it for a hold, and
-- the processes that have it refresh it. It returns the fields to write,
-- if any, and when the first pin that holds it lapses, if one does.
local function pinned(s, rate, burst)
  local hold = math.min(math.max(burst * 1e6 / rate, 1e6), 6e7)
  local pin, rx, bx
  rate, pin, rx = pinOne(pin, s[8], s[9], rate, 'cr', 'crx', hold)
  burst, pin, bx = pinOne(pin, s[10], s[11], burst, 'cb', 'cbx', hold)
  if bx and not (rx and rx < bx) then
    rx = bx
  end
  return rate, burst, pin, rx
end

-- fraction returns the share of the configured rate the key is at, its
-- epoch, and when its last decrease was and what it cut to, if any
-- (law.Fraction, in internal/law).
local function fraction(span, law)
  local s = redis.call('HMGET', KEYS[1], 'e', 'a', 'd', 'p')
  local e = tonumber(s[1]) or 0
  local p = tonumber(s[4])
  if p and p > now and p - now <= span then
    pausedTo = p
  end
  if not s[2] then
    return 1, e, nil, nil
  end
  local a, d = tonumber(s[2]) / 1e6, tonumber(s[3])
  if d > now then
    return 1, e, nil, nil -- from a clock that has stepped back
  end
  local u = (now - d) / span
  local f = a + u
  if law == 0 then
    f = a + u * u * u
  end
  return math.min(f, 1), e, d, a
end

-- refill reads a dimension's hash: its rate and burst now (the configured
-- ones, lowered to what the provider reported while that counts unless the
-- report gave the provider's bucket, which is a constraint of its own,
-- times f),
-- its tokens, the time they are as of, its expiry, whether a report counts,
-- and the provider's bucket (its rate, burst and tokens: nil unless a
-- report that counts gave a remaining), the report's end, the pin's fields
-- to write (see pinned), the configured rate and burst (after pinned),
-- and those times f: the rate and burst after the report's end. A
-- missing hash is full, or on a cold start holds only first, the amount of
-- the reservation that creates it.
local function refill(key, rate, burst, f, first)
  local exact = rate < 0 -- a window (WithWindow): not scaled, never cold
  if exact then
    rate, f = -rate, 1
    exacts[key] = true
  end
  local s = read and read[key]
  if not s then
    s = redis.call('HMGET', key, 't', 'ts', 'x', 'r', 'b', 'rx', 'p', 'cr', 'crx', 'cb', 'cbx')
    if read then read[key] = s end
  end
  local s1, s7 = s[1], s[7] -- the tokens and the provider's, less a fold (not written here)
  local pin
  rate, burst, pin, pinEnds[key] = pinned(s, rate, burst)
  local crate, cburst = rate, burst
  local learnt = s[6] and tonumber(s[6]) > now
  local pr, pb
  if learnt then
    if s[7] and s[4] and s[5] then
      pr, pb = tonumber(s[4]) / 1e6, tonumber(s[5]) / 1e6
    end
    -- a provider's bucket larger than ours is no cap on our rate (see Local.rate)
    if s[4] and not (pb and pb > burst) then rate = math.min(rate, tonumber(s[4]) / 1e6) end
    if s[5] then burst = math.min(burst, tonumber(s[5]) / 1e6) end
  end
  rate, burst = rate * f, burst * f
  if s[6] and s1 and (s[4] or s[5]) and not learnt then
    -- The report has run its time (Local.fold): ours refilled at the rate
    -- and burst it gave until its end, and holds no more than its
    -- provider's bucket, if any, held then (what that was owed at its end
    -- stays owed, in ours; a new life, since no waiter's place there holds
    -- any more); from then ours refills at our rate, from ts below, so
    -- less what that adds up to the end. Once, when the key is written
    -- (fold): its fields go. Until then the hash keeps them, and every
    -- read folds them anew, at the fraction it finds: a read changes
    -- nothing (Local.peek), and what a read wrote at one fraction was
    -- refilled from ts at a later one.
    local d = math.max(0, tonumber(s[6]) - tonumber(s[2]))
    local rr, rb = crate, cburst
    if s[4] and not (s[7] and s[5] and tonumber(s[5]) / 1e6 > cburst) then rr = math.min(rr, tonumber(s[4]) / 1e6) end
    if s[5] then rb = math.min(rb, tonumber(s[5]) / 1e6) end
    local tu = math.min(rb * f * 1e6, tonumber(s1) + d * rr * f)
    -- a debt then, paced at the report's rate, is carried into ours at
    -- what it is worth at our rate: repaid at the same moment
    if tu < 0 then tu = tu * rate / (rr * f) end
    folds[key] = false
    if s[7] and s[4] and s[5] then
      local p = math.min(tonumber(s[5]), tonumber(s[7]) + d * tonumber(s[4]) / 1e6)
      if p < 0 then p = p * rate * 1e6 / tonumber(s[4]) end
      tu = math.min(tu, p)
      folds[key] = true
    end
    s1, s7 = math.floor(tu - d * rate + 0.5), nil
  end
  if not s1 then
    local tk = burst
    if cold and not exact then tk = math.min(burst, first) end
    return rate, burst, tk, now, 0, false, nil, nil, nil, nil, pin, crate, cburst, crate * f, cburst * f
  end
  local rx
  if learnt then rx = tonumber(s[6]) end
  local ts = tonumber(s[2])
  if ts > pausedTo then
    ts = now
  end
  local el = math.max(0, now - ts)
  local tk = math.min(burst, (tonumber(s1) + el * rate) / 1e6)
  local pt
  if pr then
    pt = math.min(pb, (tonumber(s7) + el * pr) / 1e6)
  end
  return rate, burst, tk, math.max(now, ts), tonumber(s[3]) or 0, learnt, pr, pb, pt, rx, pin, crate, cburst, crate * f, cburst * f
end

-- fold writes the end of a report that refill folded into key's tokens:
-- the report's fields go, and a provider's bucket gone starts a new life.
-- The tokens are the caller's to write (store).
local function fold(key)
  local life = folds[key]
  if life == nil then
    return
  end
  folds[key] = nil
  redis.call('HDEL', key, 'p', 'r', 'b')
  local s = read and read[key]
  if s then s[4], s[5], s[7], s[107] = false, false, false, nil end
  if life then
    redis.call('HINCRBY', key, 'i', 1)
  end
end

-- store writes tk, and the provider's pt if any, as of at, and pin (see
-- pinned), extending the expiry if needed: past the time ours is full
-- again, the provider's bucket (at pr up to pb) too, the report (until
-- rx), ours again after the report's end, refilled from what it holds
-- then (see the fold in refill) at arate up to aburst, and the pin.
local function store(key, tk, at, x, rate, burst, pt, pr, pb, rx, pin, arate, aburst)
  fold(key)
  local full = at + math.ceil((burst - tk) * 1e6 / rate) + 1e6
  if exacts[key] then
    -- A window outlives its last write by two of its lengths: a hash that
    -- expired then was full, and every process's record of it (see
    -- windowsSeen in Go), held to a burst's debt, has refilled to its burst;
    -- a hash made anew sooner was lost (a restart, a flush).
    full = math.max(full, at + math.ceil(2 * burst * 1e6 / rate))
  end
  local pinx = 0
  local s = read and read[key] -- in a batch: kept, and written at its end (see read)
  if pin then
    if s then
      for j = 1, #pin, 4 do
        local o = 10 -- cb, cbx
        if pin[j] == 'cr' then o = 8 end
        s[o], s[o+1], s[o+100] = pin[j+1], pin[j+3], true
      end
    else
      redis.call('HSET', key, unpack(pin))
    end
    pinx = pin[4] -- the hash outlives its pin
  end
  if pt then
    local p = math.floor(pt * 1e6 + 0.5)
    if s then
      s[7], s[107] = p, true
    else
      redis.call('HSET', key, 'p', p)
    end
    full = math.max(full, at + math.ceil((pb - pt) * 1e6 / pr) + 1e6)
  end
  if rx then
    -- From rx ours refills at arate up to aburst, from what it holds then
    -- (the fold in refill): the hash outlives that too, or it would come
    -- back full before. As bounded as the rest: aburst / arate is a
    -- configured limit's refill time (Limit.Validate), and arate is at
    -- least rate.
    local d = math.max(0, rx - at) / 1e6
    local u = math.min(burst, tk + d * rate)
    if pt then
      u = math.min(u, pb, pt + d * pr)
    end
    full = math.max(full, rx, math.max(rx, at) + math.ceil((aburst - u) * 1e6 / arate) + 1e6)
  end
  if full > x or pinx > x then
    if x == 0 then
      -- A hash made anew (refill found none) starts a life of its own:
      -- one that Redis lost (a restart, a failover, a flush) must not come
      -- back with the life it had, whose credit a waiter's place would
      -- read a difference across (see i).
      redis.call('HSET', key, 'i', now)
    end
    x = math.max(full + math.ceil(math.min(math.max(burst * 1e6 / rate, 1e6), 6e7)), pinx)
    if s then
      s[103] = true
    else
      redis.call('HSET', key, 't', math.floor(tk * 1e6 + 0.5), 'ts', at, 'x', x)
      redis.call('PEXPIREAT', key, math.ceil(x / 1000))
    end
  elseif not s then
    redis.call('HSET', key, 't', math.floor(tk * 1e6 + 0.5), 'ts', at)
  end
  if s then
    s[1], s[2], s[3], s[101] = math.floor(tk * 1e6 + 0.5), at, x, true
  end
end

-- deficit returns how long, in microseconds after at, tokens tk (which may
-- be negative) take to reach zero at rate.
local function deficit(tk, rate)
  if tk >= 0 then
    return 0
  end
  return math.ceil(-tk * 1e6 / rate)
end

`

// luaCredit defines credit, for the scripts that credit a waiter's place
// (see place in bucket.go).
const luaCredit = `
-- credit adds d tokens to a dimension's credit field (f or fp). A credit
-- that leaves the integers a double holds exactly starts again from 0,
-- with a new life (i), so that no waiter reads a difference across it.
local function credit(key, field, d)
  local n = math.floor(d * 1e6 + 0.5)
  if n == 0 then
    return
  end
  local v = (tonumber(redis.call('HGET', key, field)) or 0) + n
  if v > 4503599627370496 or v < -4503599627370496 then
    redis.call('HINCRBY', key, 'i', 1)
    redis.call('HSET', key, 'f', 0, 'fp', 0)
  else
    redis.call('HSET', key, field, v)
  end
end

`

// luaPlace defines place, for the scripts that read a waiter's place.
const luaPlace = `
-- place appends to out what a waiter's slot rests on in a dimension: for
-- its tokens, the wait from now until tk reaches 0 at rate, its credit,
-- the rate in millionths per second and the wait until at (a pause's end);
-- for the provider's bucket, the same of pt at pr (-1 without it), its
-- credit and rate; then the hash's life; then the wait until the pin that
-- holds the dimension lapses (0: none holds it), when the slot, reckoned
-- at the pinned limit, is to be read again. The credits and the life are the
-- hash's strings, read exactly in Go. The rates are rounded up: a credit
-- is divided by them, and a rate read low would move a waiter up further
-- than the credit is worth (1.5 times at 1.5e-6/s, floored).
local function place(out, key, tk, at, rate, pt, pr)
  local c = redis.call('HMGET', key, 'f', 'fp', 'i')
  local n = #out
  out[n+1] = at - now + deficit(tk, rate)
  out[n+2] = c[1] or '0'
  out[n+3] = math.ceil(rate * 1e6)
  out[n+4] = at - now
  if pt then
    out[n+5] = at - now + deficit(pt, pr)
    out[n+7] = math.ceil(pr * 1e6)
  else
    out[n+5], out[n+7] = -1, 0
  end
  out[n+6] = c[2] or '0'
  out[n+8] = c[3] or '0'
  if folds[key] then
    out[n+8] = string.format('%d', (tonumber(c[3]) or 0) + 1) -- the life the fold starts (see fold)
  end
  out[n+9] = 0
  if pinEnds[key] then
    out[n+9] = pinEnds[key] - now
  end
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

// reserveScript takes each dimension key's amount if all of them can be
// taken within ARGV[1] microseconds, all or nothing. It returns the wait in
// microseconds (0 if the tokens were there), negated if nothing was taken
// (a refused wait is always > 0), and the key's epoch, if not 0, then the
// pins' flags if any: 1 if a dimension is held below this process's limit
// (see pinned), plus 2 if a pin too far from it was ignored (see pinOne).
// A wait of a quarter of a second or more (minMoveUp) that was taken
// replies {wait, epoch, the pins' flags (0 to 3)} and then its place in
// each dimension key. A refusal writes no pin: a process that takes
// nothing holds nobody to its limit.
//
// It takes more reservations of the key after the first, in order (see
// coalescer): each adds to ARGV its maxWait and then an amount for every
// dimension key, 0 where it charges nothing there (the first's triples
// give 0 so too). Each is decided as if it were a call of its own made
// after the one before it at the same instant: it reads what those wrote,
// and a refusal takes nothing. With more than one, the reply is a table of
// each one's reply, in order.
//
// A reservation that charges a window (WithWindow) replies a table always,
// {wait, epoch, the pins' flags} and its place if it has one, and then for
// each window it charges, in order, the window's tokens after it in
// millionths and its hash's life (i; 0: no hash).
var reserveScript = newScript(luaCommon + luaPlace + `
local f, epoch = fraction(span, law)
local k = #KEYS - 1

-- reserve decides one reservation: wmax is its maxWait, and the amount of
-- dimension key i is ARGV[o + step*i].
local function reserve(wmax, o, step)
  held, pinIgnored = false, false
  local st, wait = {}, 0
  for i = 1, k do
    local amount = tonumber(ARGV[o + step*i])
    if amount ~= 0 then
      local key = KEYS[i+1]
      local rate, burst, tk, at, x, _, pr, pb, pt, rx, pin, _, _, arate, aburst = refill(key, tonumber(ARGV[3*i+1]), tonumber(ARGV[3*i+2]), f, amount)
      tk = tk - amount
      local w = at - now + deficit(tk, rate)
      if pt then
        pt = pt - amount
        w = math.max(w, at - now + deficit(pt, pr))
      end
      st[#st+1] = {tk, at, x, rate, burst, pt, pr, pb, rx, pin, key, arate, aburst, amount, tonumber(ARGV[3*i+1]) < 0}
      wait = math.max(wait, w)
    end
  end
  if wait > wmax then
    wait = -wait
    -- Nothing is taken, but the key is written refilled up to now, as
    -- Local's is: at the fraction now, not at a later one from an older
    -- ts. A hash that refill found none of is full: it makes none. No pin
    -- is written: a refused process takes nothing, and its limit, however
    -- low, must not hold the fleet (one Reserve of a process configured
    -- 1e-6/s held a fleet at 50/s to it for the hold, and its waiters for
    -- weeks).
    for _, s in ipairs(st) do
      if s[3] > 0 then
        local pt = s[6]
        if pt then pt = pt + s[14] end
        store(s[11], s[1] + s[14], s[2], s[3], s[4], s[5], pt, s[7], s[8], s[9], nil, s[12], s[13])
      end
    end
  else
    for _, s in ipairs(st) do
      store(s[11], s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8], s[9], s[10], s[12], s[13])
    end
  end
  local pins = 0
  if held then pins = 1 end
  if pinIgnored then pins = pins + 2 end
  local out
  if wait >= 250000 then
    -- a wait that may move up (minMoveUp): its place in each dimension
    out = {wait, epoch, pins}
    for _, s in ipairs(st) do
      place(out, s[11], s[1], s[2], s[4], s[6], s[7])
    end
  end
  for _, s in ipairs(st) do
    if s[15] then
      -- a window (WithWindow): its tokens now, and its hash's life, which a
      -- hash made anew (a restart, a flush) changes: the process lowers it
      -- to what it saw the window hold (see windowsSeen)
      local tk = s[1]
      if wait < 0 then tk = tk + s[14] end
      out = out or {wait, epoch, pins}
      out[#out+1] = math.floor(tk * 1e6 + 0.5)
      out[#out+1] = tonumber(redis.call('HGET', s[11], 'i')) or 0
    end
  end
  if out then
    return out
  end
  if pins > 0 then
    return {wait, epoch, pins}
  end
  if epoch == 0 then
    return wait -- one integer is cheaper to read
  end
  return {wait, epoch}
end

-- flush writes what the batch's stores kept (see read): a hash's fields
-- in one HSET, then its expiry if that moved.
local function flush()
  for key, s in pairs(read) do
    if s[101] then
      local w = {'t', s[1], 'ts', s[2], 'x', s[3]}
      if s[107] then w[#w+1], w[#w+2] = 'p', s[7] end
      if s[108] then w[#w+1], w[#w+2], w[#w+3], w[#w+4] = 'cr', s[8], 'crx', s[9] end
      if s[110] then w[#w+1], w[#w+2], w[#w+3], w[#w+4] = 'cb', s[10], 'cbx', s[11] end
      redis.call('HSET', key, unpack(w))
      if s[103] then
        redis.call('PEXPIREAT', key, math.ceil(s[3] / 1000))
      end
    end
  end
end

if #ARGV > 3 + 3*k then
  read = {} -- a batch (see read)
end
local first = reserve(tonumber(ARGV[1]), 3, 3)
if not read then
  return first
end
local out = {first}
for o = 4 + 3*k, #ARGV, k + 1 do
  out[#out+1] = reserve(tonumber(ARGV[o]), o, 1)
end
flush()
return out
`)

// adjustScript refills each dimension key, then subtracts its amount (a
// negative amount refunds at most a burst, and never fills the key above
// it: Local.adjust). ARGV[1] is 1 if the delta
// is a served call's (Settle): a refund is then credited (see place in
// bucket.go); a debit always is, negative. A window's hash is kept when
// full (see store). It replies 1, or, if it adjusted a window (WithWindow),
// {1, then for each window in order its tokens after it in millionths and
// its hash's life (i; 0: no hash)}, as reserveScript does.
var adjustScript = newScript(luaCommon + luaCredit + `
local f = fraction(span, law)
local served = ARGV[1] == '1'
local out
for i = 1, #KEYS - 1 do
  local key, amount = KEYS[i+1], math.max(tonumber(ARGV[3*i+3]), -tonumber(ARGV[3*i+2]))
  local rate, burst, tk, at, x, learnt, pr, pb, pt, rx, pin, _, _, arate, aburst = refill(key, tonumber(ARGV[3*i+1]), tonumber(ARGV[3*i+2]), f, 0)
  local tk0, pt0 = tk, pt
  tk = math.min(burst, tk - amount)
  if pt then
    pt = math.min(pb, pt - amount)
  end
  if at > now then
    tk = math.min(tk, 0) -- paused: empty at its end, or refunds would go out at once
  end
  if tk < burst or at > now or learnt or held or pinLive or exacts[key] and x > 0 then
    if served or tk < tk0 then
      credit(key, 'f', tk - tk0)
    end
    if pt and (served or pt < pt0) then
      credit(key, 'fp', pt - pt0)
    end
    store(key, tk, at, x, rate, burst, pt, pr, pb, rx, pin, arate, aburst)
  else
    redis.call('DEL', key) -- kept while pinned: it would lose the pin
  end
  if exacts[key] then
    out = out or {1}
    out[#out+1] = math.floor(tk * 1e6 + 0.5)
    out[#out+1] = tonumber(redis.call('HGET', key, 'i')) or 0
  end
end
return out or 1
`)

// lowerScript lowers each dimension key to its amount where it holds more,
// changing nothing elsewhere: a window (WithWindow) that Redis made anew (a
// restart, a flush) while a process had seen it hold less, refilled since
// (see windowsSeen). A lowering is a cut, credited as a debit is. ARGV[1]
// is unused.
var lowerScript = newScript(luaCommon + luaCredit + `
local f = fraction(span, law)
for i = 1, #KEYS - 1 do
  local key, to = KEYS[i+1], tonumber(ARGV[3*i+3])
  local rate, burst, tk, at, x, _, pr, pb, pt, rx, pin, _, _, arate, aburst = refill(key, tonumber(ARGV[3*i+1]), tonumber(ARGV[3*i+2]), f, 0)
  if tk > to then
    credit(key, 'f', to - tk)
    store(key, to, at, x, rate, burst, pt, pr, pb, rx, pin, arate, aburst)
  end
end
return 1
`)

// queueScript returns, for each dimension key, the end of its queue as a
// place (see place): how long from now until its debt is paid, the pause
// and the provider's bucket apart, with their credits, changing nothing.
// ARGV[1] and the amounts are unused.
var queueScript = newScript(luaCommon + luaPlace + `
local f = fraction(span, law)
local out = {}
for i = 1, #KEYS - 1 do
  local rate, burst, tk, at, _, _, pr, _, pt = refill(KEYS[i+1], tonumber(ARGV[3*i+1]), tonumber(ARGV[3*i+2]), f, 0)
  place(out, KEYS[i+1], tk, at, rate, pt, pr)
end
return out
`)

// tokensScript returns each dimension key's tokens now (as of the end of a
// pause), then each one's rate, the lower of ours and the provider's
// bucket's, as strings, changing nothing (a report that has run its time
// is folded into ours as read, not written: see refill). ARGV[1] and the
// amounts are unused.
var tokensScript = newScript(luaCommon + `
local f = fraction(span, law)
local out, n = {}, #KEYS - 1
for i = 1, n do
  local rate, burst, tk, _, _, _, pr, _, pt = refill(KEYS[i+1], tonumber(ARGV[3*i+1]), tonumber(ARGV[3*i+2]), f, 0)
  if pt then
    tk, rate = math.min(tk, pt), math.min(rate, pr)
  end
  out[i] = string.format('%.17g', tk)
  out[n+i] = string.format('%.17g', rate)
end
return out
`)

// observeScript applies a response's feedback to a key (every dimension).
// ARGV: what to learn from refusals (0: nothing, 1: count this one, 2:
// forget them: the provider reported its rate), the span, the flags, the epoch
// the request was reserved in, the pause in microseconds (0: none), the
// decrease factor, the floor, the least time between decreases in
// microseconds, the threshold, the window in microseconds, the time a
// decreased rate must be kept to be known safe in microseconds; then for each
// dimension key: rate, burst, the remaining the provider reported (< 0:
// unknown), the rate and the burst it reported (0: unknown), and for how
// long those count in microseconds. It replies 1 if it decreased the rate,
// plus 2 if it set or lengthened a pause.
var observeScript = newScript(luaCommon + luaCredit + `
local f, epoch, d, a = fraction(span, law)
local nf, changed = f, 0
if ARGV[1] == '2' then
  redis.call('HDEL', KEYS[1], 'a', 'd', 'c', 'cs')
  nf = 1
elseif ARGV[1] == '1' and tonumber(ARGV[4]) >= epoch then
  local window = tonumber(ARGV[10])
  local c = redis.call('HMGET', KEYS[1], 'c', 'cs')
  local n, cs = tonumber(c[1]) or 0, tonumber(c[2]) or 0
  if now - cs > window then
    n, cs = 0, now
  end
  n = n + 1
  local held = d and now - d >= tonumber(ARGV[11]) -- adaptive.Policy.HoldWindows
  if (n >= tonumber(ARGV[9]) or held) and (not d or now - d >= tonumber(ARGV[8])) then
    nf = math.max(tonumber(ARGV[7]), f * tonumber(ARGV[6]))
    if held then
      nf = math.max(nf, math.min(a, f))
    end
    redis.call('HSET', KEYS[1], 'e', epoch + 1, 'a', math.floor(nf * 1e6 + 0.5), 'd', now, 'c', 0, 'cs', 0)
    changed = 1
    redis.call('PEXPIREAT', KEYS[1], math.ceil((now + span) / 1000) + 1000)
  else
    redis.call('HSET', KEYS[1], 'c', n, 'cs', cs)
    if redis.call('PTTL', KEYS[1]) < (window / 1000) + 1000 then
      redis.call('PEXPIRE', KEYS[1], math.ceil(window / 1000) + 1000)
    end
  end
end
local pause, paused = tonumber(ARGV[5]), 0
if pause > 0 and now + pause > pausedTo then
  pausedTo = now + pause
  changed = changed + 2
  redis.call('HSET', KEYS[1], 'p', pausedTo)
  if redis.call('PTTL', KEYS[1]) < pause / 1000 + 1000 then
    redis.call('PEXPIRE', KEYS[1], math.ceil(pause / 1000) + 1000)
  end
end
for i = 1, #KEYS - 1 do
  local key, o = KEYS[i+1], 6 * i + 6
  local crate, cburst = tonumber(ARGV[o]), tonumber(ARGV[o+1])
  local rem, rrate, rburst = tonumber(ARGV[o+2]), tonumber(ARGV[o+3]), tonumber(ARGV[o+4])
  local rate, burst, tk, at, x, _, pr, pb, pt, rx, pin, prate, pburst = refill(key, crate, cburst, f, 0)
  fold(key) -- before a report writes its fields
  local tk0, at0, rate0, burst0, pt0, pr0, pb0 = tk, at, rate, burst, pt, pr, pb
  local valid = tonumber(ARGV[o+5])
  local f, nf, pause = f, nf, pause
  if crate < 0 then
    -- a window (WithWindow): not scaled, not paused, not reported on
    f, nf, pause = 1, 1, 0
  end
  crate, cburst = prate, pburst -- this process's, or the fleet's lowest
  if pause > 0 and now + pause > at then
    -- empty at the pause's end but for the debt due after it (pauseTokens);
    -- the provider's bucket refills meanwhile
    paused = math.max(paused, now + pause - at)
    if pt then
      pt = math.min(pb, pt + (now + pause - at) / 1e6 * pr)
    end
    tk, at = math.min(0, tk + (now + pause - at) / 1e6 * rate * nf / f), now + pause
  end
  if rrate > 0 and rburst > 0 and rem >= 0 then
    -- the provider's bucket: its remaining now, never raised by a report
    -- that may be older than what the fleet has spent since, but seeded
    -- anew once the last report has run its time
    if pt then
      pt = math.min(pt, rem)
    else
      pt = math.min(rem, rburst)
    end
    rx = now + valid
    redis.call('HSET', key, 'r', math.floor(rrate * 1e6 + 0.5), 'b', math.floor(rburst * 1e6 + 0.5), 'rx', rx)
    pr, pb = rrate, rburst
    rate, burst = crate * f, math.min(cburst, rburst) * f
    if rburst <= cburst then
      rate = math.min(crate, rrate) * f -- a provider's bucket no larger than ours caps our rate (see Local.rate)
    end
  elseif pt and rem >= 0 then
    -- a report of the provider's bucket that gives no rate (it is full):
    -- the rate it last gave stands
    pt = math.min(pt, rem)
    if rburst > 0 then
      -- a limit: the report's own time (a remaining alone says nothing of it)
      pb, rx = rburst, now + valid
      redis.call('HSET', key, 'b', math.floor(rburst * 1e6 + 0.5), 'rx', rx)
    end
  else
    if rem >= 0 then
      if pt then pt = math.min(pt, rem) else tk = math.min(tk, rem) end
    end
    if rrate > 0 or rburst > 0 then
      -- a report replaces the last: what it does not say no longer counts
      redis.call('HDEL', key, 'r', 'b', 'p')
      rx = now + valid
      redis.call('HSET', key, 'rx', rx)
      if pt then
        tk = math.min(tk, pt) -- what the provider's bucket was owed stays owed, in ours
      end
      rate, burst, pt = crate * f, cburst * f, nil
      if rrate > 0 then
        redis.call('HSET', key, 'r', math.floor(rrate * 1e6 + 0.5))
        rate = math.min(crate, rrate) * f
      end
      if rburst > 0 then
        redis.call('HSET', key, 'b', math.floor(rburst * 1e6 + 0.5))
        burst = math.min(cburst, rburst) * f
      end
    end
  end
  tk = math.min(tk, burst * nf / f)
  -- What a cut or a pause took, against what time alone would have left
  -- by at, is debited from the credits: the waiters' places move no
  -- earlier for it. A provider's bucket seeded anew starts a new life.
  local left = math.min(burst0, tk0 + (at - at0) / 1e6 * rate0)
  if tk < left then
    credit(key, 'f', tk - left)
  end
  if pt and pt0 then
    left = math.min(pb0, pt0 + (at - at0) / 1e6 * pr0)
    if pt < left then
      credit(key, 'fp', pt - left)
    end
  elseif pt then
    redis.call('HINCRBY', key, 'i', 1)
    redis.call('HSET', key, 'fp', 0)
  end
  store(key, tk, at, x, rate * nf / f, burst * nf / f, pt, pr, pb, rx, pin, crate * nf, cburst * nf)
end
-- The time paused does not count toward the threshold's window; the count,
-- moved on, must outlive the hash no more than before.
if paused > 0 and tonumber(redis.call('HGET', KEYS[1], 'c') or 0) > 0 then
  local cs = redis.call('HINCRBY', KEYS[1], 'cs', paused)
  local ttl = math.ceil((cs + tonumber(ARGV[10]) - now) / 1000) + 1000
  local left = redis.call('PTTL', KEYS[1])
  if left >= 0 and left < ttl then
    redis.call('PEXPIRE', KEYS[1], ttl)
  end
end
return changed
`)
