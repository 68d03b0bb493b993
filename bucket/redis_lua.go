package bucket

// The token bucket scripts keep a key's state in hashes whose fields they
// name as Local does (see state_lua.go): a dimension's tokens, at,
// expires, the provider's report (reportedRate, reportedBurst,
// reportedUntil, provider), the fleet's pins (pinnedRate, pinnedBurst and
// until when), the credits and the life; the law's epoch, after,
// decreased, refused, counting and pausedUntil.
//
// Times are integer microseconds: exact in a Lua double, and passed to
// redis.call as numbers, which Redis writes with 17 digits (never through
// tostring or "..", which keep only 14). Fractions are stored as integer
// millionths: a fraction could be written in exponent form ("2e-06"), which
// gopher-lua (miniredis) cannot read back. A key must outlive its refill,
// debt and pause (a key that vanished early would come back full), and the
// adaptive state its recovery. The expiry is pushed out only when that need
// passes expires, and then past it by one more refill time (1 to 60 s), so
// a hot key does not pay a PEXPIREAT per call, and an idle key disappears
// soon after it is full again; a window (WithWindow), two of its lengths
// after its last write (see store).
//
// A dimension's at lies in the future only while a pause holds the key,
// and never later than pausedUntil. An at later than that, or a
// pausedUntil later than a pause can last (span), means the server's clock
// has stepped back (a failover to a replica whose clock lags): the time is
// taken as now, so a step back delays no call, unless it comes during a
// pause, and then by at most span. A decrease dated in the future is
// forgotten for the same reason.
//
// Every number the scripts get is bounded in Go first (Limit.Validate, the
// reports and pauses of adaptation), so that no time or amount they compute
// leaves the integers a Lua double holds exactly, and no write can fail
// halfway through a script.
//
// The scripts' ARGV and replies are laid out in codec.go, whose names the
// scripts use (ARG_SPAN, DIM_RATE, …): a head (the operation's argument,
// the recovery span in microseconds, the law's flags), then a group per
// dimension key (its kind, a window or not, its rate in tokens/s, burst
// and amount).

// luaCommon defines now, the key's adaptive state (law) and the functions
// every token bucket script uses.
var luaCommon = luaCommonOf(lawRead)

// luaCommonOf is luaCommon with the fields law of the adaptive state read.
func luaCommonOf(law []stateField) string {
	return `
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local span, flags = tonumber(ARGV[ARG_SPAN]), tonumber(ARGV[ARG_FLAGS])
local additive = flags % (2 * FLAG_ADDITIVE) >= FLAG_ADDITIVE -- the recovery law: additive, or cubic
local cold = flags % (2 * FLAG_COLD) >= FLAG_COLD
local pausedTo = now -- the latest a dimension's at may be (see above)
local held = false -- a dimension is held below this process's limit (see pinned)
local pinLive = false -- a dimension read has a pin that holds (see pinned)
local pinIgnored = false -- a dimension read has a pin too far from this process's limit to count (see pinOne)
` + luaLoadLaw(law) + luaState + `
-- pinOne is pinned's of one limit: own, or v while it holds (until vx,
-- returned then), adding to pin (made if nil) the fields name and untilName
-- to write, each followed by its value, if any. A pin more than
-- maxPinRatio times below or above own is a configuration error (a unit or
-- a typo: no rollout changes a limit so far), not a limit: it does not
-- count for this process, which neither keeps to it nor refrains from
-- writing its own, and says so (pinIgnored: logged at error level), so
-- that one absurd process cannot stall the fleet.
local maxPinRatio = 1000
local function pinOne(pin, v, vx, own, name, untilName, hold)
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
  pin[n+1], pin[n+2], pin[n+3], pin[n+4] = name, u, untilName, now + hold
  return own, pin
end

-- pinned returns the rate and burst of the dimension d: this process's
-- own, or lower ones that another process of the fleet has used within a
-- hold (the limit's refill time, 1 to 60 s): pinnedRate until
-- pinnedRateUntil, pinnedBurst until pinnedBurstUntil, each the lowest in
-- use. So processes whose limits disagree never mix them: the lowest holds
-- for all until no process has used it for a hold, and the processes that
-- have it refresh it. It returns the fields to write, if any, and when the
-- first pin that holds it lapses, if one does.
local function pinned(d, rate, burst)
  local hold = math.min(math.max(burst * 1e6 / rate, 1e6), 6e7)
  local pin, rx, bx
  rate, pin, rx = pinOne(pin, d.pinnedRate, d.pinnedRateUntil, rate, 'pinnedRate', 'pinnedRateUntil', hold)
  burst, pin, bx = pinOne(pin, d.pinnedBurst, d.pinnedBurstUntil, burst, 'pinnedBurst', 'pinnedBurstUntil', hold)
  if bx and not (rx and rx < bx) then
    rx = bx
  end
  return rate, burst, pin, rx
end

-- fraction returns the share of the configured rate the key is at, its
-- epoch, and when its last decrease was and what it cut to, if any
-- (law.Fraction, in internal/law).
local function fraction()
  local e = tonumber(law.epoch) or 0
  local p = tonumber(law.pausedUntil)
  if p and p > now and p - now <= span then
    pausedTo = p
  end
  if not law.after then
    return 1, e, nil, nil
  end
  local a, d = tonumber(law.after) / 1e6, tonumber(law.decreased)
  if d > now then
    return 1, e, nil, nil -- from a clock that has stepped back
  end
  local u = (now - d) / span
  local f = a + u
  if not additive then
    f = a + u * u * u
  end
  return math.min(f, 1), e, d, a
end

-- reportCaps returns the rate and burst of the dimension d lowered to what
-- a report that counts gave, unless the report gave the provider's bucket,
-- which is a constraint of its own; and that bucket's rate and burst if it
-- has one.
local function reportCaps(d, rate, burst)
  local pr, pb
  if d.provider and d.reportedRate and d.reportedBurst then
    pr, pb = tonumber(d.reportedRate) / 1e6, tonumber(d.reportedBurst) / 1e6
  end
  -- a provider's bucket larger than ours is no cap on our rate (see dimState.rate)
  if d.reportedRate and not (pb and pb > burst) then rate = math.min(rate, tonumber(d.reportedRate) / 1e6) end
  if d.reportedBurst then burst = math.min(burst, tonumber(d.reportedBurst) / 1e6) end
  return rate, burst, pr, pb
end

-- folded returns the tokens of the dimension d (in millionths, as of
-- d.at) with the report that has run its time folded in (dimState.fold), at
-- fraction f, and whether the fold starts a new life (a provider's bucket
-- gone). Ours refilled at the rate and burst the report gave until its end
-- (reportedUntil), and holds no more than its provider's bucket, if any,
-- held then (what that was owed at its end stays owed, in ours; a new
-- life, since no waiter's place there holds any more); from then ours
-- refills at our rate (d.rate), from at, so less what that adds up to the
-- end. Once, when the key is written (fold): its fields go. Until then the
-- hash keeps them, and every read folds them anew, at the fraction it
-- finds: a read changes nothing (Local.peek), and what a read wrote at one
-- fraction was refilled from at at a later one.
local function folded(d, f)
  local dt = math.max(0, tonumber(d.reportedUntil) - tonumber(d.at))
  local rr, rb, rate = d.ownRate, d.ownBurst, d.rate
  if d.reportedRate and not (d.provider and d.reportedBurst and tonumber(d.reportedBurst) / 1e6 > rb) then
    rr = math.min(rr, tonumber(d.reportedRate) / 1e6)
  end
  if d.reportedBurst then rb = math.min(rb, tonumber(d.reportedBurst) / 1e6) end
  local tu = math.min(rb * f * 1e6, tonumber(d.tokens) + dt * rr * f)
  -- a debt then, paced at the report's rate, is carried into ours at
  -- what it is worth at our rate: repaid at the same moment
  if tu < 0 then tu = tu * rate / (rr * f) end
  local life = false
  if d.provider and d.reportedRate and d.reportedBurst then
    local p = math.min(tonumber(d.reportedBurst), tonumber(d.provider) + dt * tonumber(d.reportedRate) / 1e6)
    if p < 0 then p = p * rate * 1e6 / tonumber(d.reportedRate) end
    tu = math.min(tu, p)
    life = true
  end
  return math.floor(tu - dt * rate + 0.5), life
end

-- refill loads the dimension key (see luaLoad) and sets in its table
-- what it is as of now, at fraction f, beside its state, with the kind,
-- rate and burst of its group of ARGV, which begins at o + 1 (see codec.go):
--
--	window                 a window (WithWindow): not scaled, never cold
--	rate, burst            now: the configured ones (after pinned), lowered to
--	                       what the provider reported while that counts (see
--	                       reportCaps), times f
--	tokensNow, atNow       its tokens, and the time they are as of
--	expiresNow             its expiry; 0 if there is no hash
--	reportedNow            whether a report counts (reportedUntil then)
--	providerNow            the provider's tokens, at providerRate up to
--	                       providerBurst: false unless a report that counts
--	                       gave a remaining
--	pin, pinEnd            the pin's fields to write, and when the first pin
--	                       that holds it lapses (see pinned)
--	ownRate, ownBurst      the configured rate and burst (after pinned)
--	scale                  f: ownRate and ownBurst times scale are the rate
--	                       and burst after the report's end
--	fold                   false, or the report that has run its time is to
--	                       go when the key is written, with the life 'same'
--	                       or a 'new' one (see fold)
--
-- and returns that table. A missing hash is full, or on a cold start holds
-- only first, the amount of the reservation that creates it.
local function refill(key, o, f, first)
  ` + luaLoad + `  local rate, burst = tonumber(ARGV[o + DIM_RATE]), tonumber(ARGV[o + DIM_BURST])
  d.window = tonumber(ARGV[o + DIM_KIND]) == KIND_WINDOW
  if d.window then
    f = 1
  end
  rate, burst, d.pin, d.pinEnd = pinned(d, rate, burst)
  d.ownRate, d.ownBurst, d.scale = rate, burst, f
  d.reportedNow = d.reportedUntil and tonumber(d.reportedUntil) > now or false
  local pr, pb
  if d.reportedNow then
    rate, burst, pr, pb = reportCaps(d, rate, burst)
  end
  d.rate, d.burst, d.providerRate, d.providerBurst, d.providerNow = rate * f, burst * f, pr, pb, false
  local tokens, life = d.tokens, false -- less a fold (not written here)
  d.fold = false
  if d.reportedUntil and tokens and (d.reportedRate or d.reportedBurst) and not d.reportedNow then
    tokens, life = folded(d, f)
    d.fold = life and 'new' or 'same'
  end
  if not tokens then
    d.tokensNow, d.atNow, d.expiresNow, d.reportedNow = d.burst, now, 0, false
    d.providerRate, d.providerBurst = false, false
    if cold and not d.window then
      d.tokensNow = math.min(d.burst, first)
    end
    return d
  end
  local ts = tonumber(d.at)
  if ts > pausedTo then
    ts = now
  end
  local el = math.max(0, now - ts)
  d.tokensNow = math.min(d.burst, (tonumber(tokens) + el * d.rate) / 1e6)
  if pr then
    d.providerNow = math.min(pb, (tonumber(d.provider) + el * pr) / 1e6)
  end
  d.atNow, d.expiresNow = math.max(now, ts), tonumber(d.expires) or 0
  return d
end

-- fold sets the end of a report that refill folded into d's tokens: the
-- report's fields go, and a provider's bucket gone starts a new life. The
-- tokens are the caller's to set (store).
local function fold(d)
  if not d.fold then
    return
  end
  set(d, 'provider', false)
  set(d, 'reportedRate', false)
  set(d, 'reportedBurst', false)
  if d.fold == 'new' then
    credits(d)
    set(d, 'life', (tonumber(d.life) or 0) + 1)
  end
  d.fold = false
end

-- fullAt returns when the dimension d, stored, is full again: ours, the
-- provider's bucket (at providerRate up to providerBurst) too, the report
-- (until reportedUntil), and ours again after the report's end, refilled
-- from what it holds then (see folded) at ownRate up to ownBurst, times
-- scale.
local function fullAt(d)
  local at, tk, rate, burst = d.atNow, d.tokensNow, d.rate, d.burst
  local pt, pr, pb = d.providerNow, d.providerRate, d.providerBurst
  local full = at + math.ceil((burst - tk) * 1e6 / rate) + 1e6
  if d.window then
    -- A window outlives its last write by two of its lengths: a hash that
    -- expired then was full, and every process's record of it (see
    -- windowsSeen in Go), held to a burst's debt, has refilled to its burst;
    -- a hash made anew sooner was lost (a restart, a flush).
    full = math.max(full, at + math.ceil(2 * burst * 1e6 / rate))
  end
  if pt then
    full = math.max(full, at + math.ceil((pb - pt) * 1e6 / pr) + 1e6)
  end
  if d.reportedNow then
    -- From reportedUntil ours refills at ownRate up to ownBurst, times
    -- scale, from what it holds then (folded): the hash outlives that too,
    -- or it would come back full before. As bounded as the rest: ownBurst /
    -- ownRate is a configured limit's refill time (Limit.Validate), and
    -- ownRate times scale is at least rate.
    local rx = tonumber(d.reportedUntil)
    local dt = math.max(0, rx - at) / 1e6
    local u = math.min(burst, tk + dt * rate)
    if pt then
      u = math.min(u, pb, pt + dt * pr)
    end
    full = math.max(full, rx, math.max(rx, at) + math.ceil((d.ownBurst * d.scale - u) * 1e6 / (d.ownRate * d.scale)) + 1e6)
  end
  return full
end

-- store sets d's tokens, and the provider's if any, as of its atNow, and
-- its pin (see pinned), to be written at the script's end (saveAll),
-- extending the expiry if needed: past fullAt, and the pin.
local function store(d)
  fold(d)
  local pin, pinx = d.pin, 0
  if pin then
    for j = 1, #pin, 2 do
      set(d, pin[j], pin[j+1])
    end
    pinx = pin[4] -- the hash outlives its pin
  end
  if d.providerNow then
    set(d, 'provider', math.floor(d.providerNow * 1e6 + 0.5))
  end
  local x, full = d.expiresNow, fullAt(d)
  if full > x or pinx > x then
    if x == 0 then
      -- A hash made anew (refill found none) starts a life of its own:
      -- one that Redis lost (a restart, a failover, a flush) must not come
      -- back with the life it had, whose credit a waiter's place would
      -- read a difference across (see life).
      set(d, 'life', now)
    end
    x = math.max(full + math.ceil(math.min(math.max(d.burst * 1e6 / d.rate, 1e6), 6e7)), pinx)
    set(d, 'expires', x)
  end
  set(d, 'tokens', math.floor(d.tokensNow * 1e6 + 0.5))
  set(d, 'at', d.atNow)
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
}

// luaCredit defines credit, for the scripts that credit a waiter's place
// (see place in bucket.go).
const luaCredit = `
-- credit adds delta tokens to the credit named name (credit or
-- providerCredit) of the dimension d. A credit that leaves the integers a
-- double holds exactly starts again from 0, with a new life, so that no
-- waiter reads a difference across it.
local function credit(d, name, delta)
  local n = math.floor(delta * 1e6 + 0.5)
  if n == 0 then
    return
  end
  credits(d)
  local v = (tonumber(d[name]) or 0) + n
  if v > 4503599627370496 or v < -4503599627370496 then
    set(d, 'life', (tonumber(d.life) or 0) + 1)
    set(d, 'credit', 0)
    set(d, 'providerCredit', 0)
  else
    set(d, name, v)
  end
end

`

// luaPlace defines place, for the scripts that read a waiter's place.
const luaPlace = `
-- place appends to out what a waiter's slot rests on in the dimension d
-- (see refill): for its tokens, the wait from now until they reach 0 at
-- its rate, its credit, the rate in millionths per second and the wait
-- until atNow (a pause's end); for the provider's bucket, the same of
-- providerNow at providerRate (-1 without it), its credit and rate; then
-- the hash's life; then the wait until the pin that holds the dimension
-- lapses (0: none holds it), when the slot, reckoned at the pinned limit,
-- is to be read again. The credits and the life are the hash's strings,
-- read exactly in Go (a number the script set, as Redis writes it). The
-- rates are rounded up: a credit is divided by them, and a rate read low
-- would move a waiter up further than the credit is worth (1.5 times at
-- 1.5e-6/s, floored).
local function place(out, d)
  credits(d)
  local n, c, fc, life = #out, d.credit or '0', d.providerCredit or '0', d.life or '0'
  if type(c) == 'number' then c = string.format('%d', c) end
  if type(fc) == 'number' then fc = string.format('%d', fc) end
  if type(life) == 'number' then life = string.format('%d', life) end
  out[n + PLACE_WAIT] = d.atNow - now + deficit(d.tokensNow, d.rate)
  out[n + PLACE_CREDIT] = c
  out[n + PLACE_RATE] = math.ceil(d.rate * 1e6)
  out[n + PLACE_FROM] = d.atNow - now
  out[n + PLACE_PROVIDER_WAIT], out[n + PLACE_PROVIDER_RATE] = -1, 0
  if d.providerNow then
    out[n + PLACE_PROVIDER_WAIT] = d.atNow - now + deficit(d.providerNow, d.providerRate)
    out[n + PLACE_PROVIDER_RATE] = math.ceil(d.providerRate * 1e6)
  end
  out[n + PLACE_PROVIDER_CREDIT] = fc
  out[n + PLACE_LIFE] = life
  if d.fold == 'new' then
    out[n + PLACE_LIFE] = string.format('%d', (tonumber(d.life) or 0) + 1) -- the life the fold starts (see fold)
  end
  out[n + PLACE_PIN_END] = 0
  if d.pinEnd then
    out[n + PLACE_PIN_END] = d.pinEnd - now
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
// taken within maxWait (argOp) microseconds, all or nothing. It returns the wait in
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
// dimension key, 0 where it charges nothing there (the first's groups
// give 0 so too). Each is decided as if it were a call of its own made
// after the one before it at the same instant: it reads what those set
// (see loaded), and a refusal takes nothing. With more than one, the reply
// is a table of each one's reply, in order.
//
// A reservation that charges a window (WithWindow) replies a table always,
// {wait, epoch, the pins' flags} and its place if it has one, and then for
// each window it charges, in order, the window's tokens after it in
// millionths and its hash's life (0: no hash).
var reserveScript = newScript(luaCommon + luaPlace + `
local f, epoch = fraction()
local k = #KEYS - 1

-- take refills each dimension key a reservation charges and takes its
-- amount, that of dimension key i being ARGV[o + step*i]: it returns the
-- dimensions (see refill), each with its amount, and the wait.
local function take(o, step)
  held, pinIgnored = false, false
  local st, wait = {}, 0
  for i = 1, k do
    local amount = tonumber(ARGV[o + step*i])
    if amount ~= 0 then
      local d = refill(KEYS[i+1], ARG_HEAD + DIM_ARGS*(i-1), f, amount)
      d.amount, d.tokensNow = amount, d.tokensNow - amount
      local w = d.atNow - now + deficit(d.tokensNow, d.rate)
      if d.providerNow then
        d.providerNow = d.providerNow - amount
        w = math.max(w, d.atNow - now + deficit(d.providerNow, d.providerRate))
      end
      st[#st+1] = d
      wait = math.max(wait, w)
    end
  end
  return st, wait
end

-- reply is a reservation's reply (see above), of the dimensions st and
-- the wait.
local function reply(st, wait)
  local pins = 0
  if held then pins = PIN_HELD end
  if pinIgnored then pins = pins + PIN_IGNORED end
  local out
  if wait >= 250000 then
    -- a wait that may move up (minMoveUp): its place in each dimension
    out = {wait, epoch, pins} -- REPLY_WAIT, REPLY_EPOCH, REPLY_PINS
    for _, d in ipairs(st) do
      place(out, d)
    end
  end
  for _, d in ipairs(st) do
    if d.window then
      -- a window (WithWindow): its tokens now, and its hash's life, which a
      -- hash made anew (a restart, a flush) changes: the process lowers it
      -- to what it saw the window hold (see windowsSeen)
      out = out or {wait, epoch, pins}
      credits(d)
      out[#out+1] = math.floor(d.tokensNow * 1e6 + 0.5)
      out[#out+1] = tonumber(d.life) or 0
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

-- reserve decides one reservation: wmax is its maxWait, and the amount of
-- dimension key i is ARGV[o + step*i]. A refusal gives back what take
-- took. Nothing is taken, but the key is written refilled up to now, as
-- Local's is: at the fraction now, not at a later one from an older at. A
-- hash that refill found none of is full: it makes none. No pin is
-- written: a refused process takes nothing, and its limit, however low,
-- must not hold the fleet (one Reserve of a process configured 1e-6/s held
-- a fleet at 50/s to it for the hold, and its waiters for weeks).
local function reserve(wmax, o, step)
  local st, wait = take(o, step)
  local refused = wait > wmax
  for _, d in ipairs(st) do
    if refused then
      d.tokensNow, d.pin = d.tokensNow + d.amount, false
      if d.providerNow then d.providerNow = d.providerNow + d.amount end
    end
    if not refused or d.expiresNow > 0 then
      store(d)
    end
  end
  if refused then
    wait = -wait
  end
  return reply(st, wait)
end

local out = reserve(tonumber(ARGV[ARG_OP]), ARG_HEAD + DIM_AMOUNT - DIM_ARGS, DIM_ARGS)
if #ARGV > ARG_HEAD + DIM_ARGS*k then
  out = {out} -- a batch
  for o = ARG_HEAD + DIM_ARGS*k + BATCH_WAIT, #ARGV, k + 1 do
    out[#out+1] = reserve(tonumber(ARGV[o]), o, 1)
  end
end
saveAll()
return out
`)

// adjustScript refills each dimension key, then subtracts its amount (a
// negative amount refunds at most a burst, and never fills the key above
// it: Local.adjust). argOp is adjustServed if the delta
// is a served call's (Settle): a refund is then credited (see place in
// bucket.go); a debit always is, negative. A window's hash is kept when
// full (see store). It replies 1, or, if it adjusted a window (WithWindow),
// {1, then for each window in order its tokens after it in millionths and
// its hash's life (0: no hash)}, as reserveScript does.
var adjustScript = newScript(luaCommon + luaCredit + `
local f = fraction()
local served = tonumber(ARGV[ARG_OP]) == ADJUST_SERVED

-- adjust subtracts amount from the dimension d (see refill), crediting
-- it, or drops d's hash if that leaves it full with nothing to keep.
local function adjust(key, d, amount)
  local tk0, pt0 = d.tokensNow, d.providerNow
  d.tokensNow = math.min(d.burst, d.tokensNow - amount)
  if d.providerNow then
    d.providerNow = math.min(d.providerBurst, d.providerNow - amount)
  end
  if d.atNow > now then
    d.tokensNow = math.min(d.tokensNow, 0) -- paused: empty at its end, or refunds would go out at once
  end
  if d.tokensNow < d.burst or d.atNow > now or d.reportedNow or held or pinLive or d.window and d.expiresNow > 0 then
    if served or d.tokensNow < tk0 then
      credit(d, 'credit', d.tokensNow - tk0)
    end
    if d.providerNow and (served or d.providerNow < pt0) then
      credit(d, 'providerCredit', d.providerNow - pt0)
    end
    store(d)
  else
    loaded[key] = {dropped = true} -- kept while pinned: it would lose the pin
  end
end

local out
for i = 1, #KEYS - 1 do
  local o = ARG_HEAD + DIM_ARGS*(i-1)
  local d = refill(KEYS[i+1], o, f, 0)
  adjust(KEYS[i+1], d, math.max(tonumber(ARGV[o + DIM_AMOUNT]), -tonumber(ARGV[o + DIM_BURST])))
  if d.window then
    local life = 0 -- no hash, if dropped
    if loaded[KEYS[i+1]] == d then
      credits(d)
      life = tonumber(d.life) or 0
    end
    out = out or {1}
    out[#out+1] = math.floor(d.tokensNow * 1e6 + 0.5)
    out[#out+1] = life
  end
end
saveAll()
return out or 1
`)

// lowerScript lowers each dimension key to its amount where it holds more,
// changing nothing elsewhere: a window (WithWindow) that Redis made anew (a
// restart, a flush) while a process had seen it hold less, refilled since
// (see windowsSeen). A lowering is a cut, credited as a debit is. argOp
// is unused.
var lowerScript = newScript(luaCommon + luaCredit + `
local f = fraction()
for i = 1, #KEYS - 1 do
  local o = ARG_HEAD + DIM_ARGS*(i-1)
  local to = tonumber(ARGV[o + DIM_AMOUNT])
  local d = refill(KEYS[i+1], o, f, 0)
  if d.tokensNow > to then
    credit(d, 'credit', to - d.tokensNow)
    d.tokensNow = to
    store(d)
  end
end
saveAll()
return 1
`)

// queueScript returns, for each dimension key, the end of its queue as a
// place (see place): how long from now until its debt is paid, the pause
// and the provider's bucket apart, with their credits, changing nothing.
// argOp and the amounts are unused.
var queueScript = newScript(luaCommon + luaPlace + `
local f = fraction()
local out = {}
for i = 1, #KEYS - 1 do
  place(out, refill(KEYS[i+1], ARG_HEAD + DIM_ARGS*(i-1), f, 0))
end
return out
`)

// tokensScript returns each dimension key's tokens now (as of the end of a
// pause), then each one's rate, the lower of ours and the provider's
// bucket's, as strings, changing nothing (a report that has run its time
// is folded into ours as read, not written: see refill). argOp and the
// amounts are unused.
var tokensScript = newScript(luaCommon + `
local f = fraction()
local out, n = {}, #KEYS - 1
for i = 1, n do
  local d = refill(KEYS[i+1], ARG_HEAD + DIM_ARGS*(i-1), f, 0)
  local tk, rate = d.tokensNow, d.rate
  if d.providerNow then
    tk, rate = math.min(tk, d.providerNow), math.min(rate, d.providerRate)
  end
  out[i] = string.format('%.17g', tk)
  out[n+i] = string.format('%.17g', rate)
end
return out
`)

// observeScript applies a response's feedback to a key (every dimension).
// ARGV (codec.go, obs*): what to learn from refusals (the verdict: nothing,
// count this one, or forget them: the provider reported its rate), the
// span, the flags, the epoch the request was reserved in, the pause in
// microseconds (0: none), the decrease factor, the floor, the least time
// between decreases in microseconds, the threshold, the window in
// microseconds, the time a decreased rate must be kept to be known safe in
// microseconds; then for each dimension key: its kind, rate, burst, the
// remaining the provider reported (< 0: unknown), the rate and the burst
// it reported (0: unknown), and for how long those count in microseconds.
// It replies observedDecrease if it decreased the rate, plus
// observedPause if it set or lengthened a pause.
var observeScript = newScript(luaCommonOf(lawFields) + luaCredit + luaLawSave + `
local f, epoch, decreased, after = fraction()

-- The law's expiry is set at the script's end (expireLaw), after its
-- fields, by these, in order: an absolute time (at, in ms), or a time to
-- live (to, in ms) if the key's is below below (and the key has one, if
-- live).
local lawExpiry = {}

-- expireLaw sets the law's expiry as lawExpiry says, after saveLaw.
local function expireLaw()
  for _, e in ipairs(lawExpiry) do
    if e.at then
      redis.call('PEXPIREAT', KEYS[1], e.at)
    else
      local left = redis.call('PTTL', KEYS[1])
      if left < e.below and (left >= 0 or not e.live) then
        redis.call('PEXPIRE', KEYS[1], e.to)
      end
    end
  end
end

-- learn applies what the verdict (OBS_VERDICT) says to learn from refusals to the law's
-- state: it returns the fraction after it, and OBSERVED_DECREASE if it
-- decreased it (else 0).
local function learn()
  local verdict = tonumber(ARGV[OBS_VERDICT])
  if verdict == VERDICT_FORGET then
    set(law, 'after', false)
    set(law, 'decreased', false)
    set(law, 'refused', false)
    set(law, 'counting', false)
    return 1, 0
  end
  if verdict ~= VERDICT_COUNT or tonumber(ARGV[OBS_EPOCH]) < epoch then
    return f, 0
  end
  local window = tonumber(ARGV[OBS_WINDOW])
  local n, cs = tonumber(law.refused) or 0, tonumber(law.counting) or 0
  if now - cs > window then
    n, cs = 0, now
  end
  n = n + 1
  local safe = decreased and now - decreased >= tonumber(ARGV[OBS_HOLD]) -- adaptive.Policy.HoldWindows
  if (n >= tonumber(ARGV[OBS_THRESHOLD]) or safe) and (not decreased or now - decreased >= tonumber(ARGV[OBS_MIN_EPOCH])) then
    local nf = math.max(tonumber(ARGV[OBS_FLOOR]), f * tonumber(ARGV[OBS_DECREASE]))
    if safe then
      nf = math.max(nf, math.min(after, f))
    end
    set(law, 'epoch', epoch + 1)
    set(law, 'after', math.floor(nf * 1e6 + 0.5))
    set(law, 'decreased', now)
    set(law, 'refused', 0)
    set(law, 'counting', 0)
    lawExpiry[#lawExpiry+1] = {at = math.ceil((now + span) / 1000) + 1000}
    return nf, OBSERVED_DECREASE
  end
  set(law, 'refused', n)
  set(law, 'counting', cs)
  lawExpiry[#lawExpiry+1] = {below = (window / 1000) + 1000, to = math.ceil(window / 1000) + 1000}
  return f, 0
end

-- pauseDim empties the dimension d (see refill) at the pause's end but for
-- the debt due after it (pauseTokens), at fraction nf after the law; the
-- provider's bucket refills meanwhile. It returns how far it moved atNow.
local function pauseDim(d, pause, f, nf)
  local dt = now + pause - d.atNow
  if d.providerNow then
    d.providerNow = math.min(d.providerBurst, d.providerNow + dt / 1e6 * d.providerRate)
  end
  d.tokensNow, d.atNow = math.min(0, d.tokensNow + dt / 1e6 * d.rate * nf / f), now + pause
  return dt
end

-- reportUntil sets the end of the report that the dimension d takes.
local function reportUntil(d, rx)
  set(d, 'reportedUntil', rx)
  d.reportedNow = true
end

-- reportBucket takes a report of the provider's bucket, its rate rrate,
-- burst rburst and remaining rem, into the dimension d, until rx: its
-- remaining now, never raised by a report that may be older than what the
-- fleet has spent since, but seeded anew once the last report has run its
-- time.
local function reportBucket(d, rem, rrate, rburst, rx, f)
  if d.providerNow then
    d.providerNow = math.min(d.providerNow, rem)
  else
    d.providerNow = math.min(rem, rburst)
  end
  reportUntil(d, rx)
  set(d, 'reportedRate', math.floor(rrate * 1e6 + 0.5))
  set(d, 'reportedBurst', math.floor(rburst * 1e6 + 0.5))
  d.providerRate, d.providerBurst = rrate, rburst
  d.rate, d.burst = d.ownRate * f, math.min(d.ownBurst, rburst) * f
  if rburst <= d.ownBurst then
    d.rate = math.min(d.ownRate, rrate) * f -- a provider's bucket no larger than ours caps our rate (see dimState.rate)
  end
end

-- reportLimits takes a report that gives no provider's bucket into the
-- dimension d, until rx: its remaining caps ours (or the provider's
-- bucket, which it leaves, if there is one), and its rate and burst, if
-- any, replace the last report's: what it does not say no longer counts.
local function reportLimits(d, rem, rrate, rburst, rx, f)
  if rem >= 0 then
    if d.providerNow then d.providerNow = math.min(d.providerNow, rem) else d.tokensNow = math.min(d.tokensNow, rem) end
  end
  if rrate <= 0 and rburst <= 0 then
    return
  end
  set(d, 'reportedRate', false)
  set(d, 'reportedBurst', false)
  set(d, 'provider', false)
  reportUntil(d, rx)
  if d.providerNow then
    d.tokensNow = math.min(d.tokensNow, d.providerNow) -- what the provider's bucket was owed stays owed, in ours
  end
  d.rate, d.burst, d.providerNow = d.ownRate * f, d.ownBurst * f, false
  if rrate > 0 then
    set(d, 'reportedRate', math.floor(rrate * 1e6 + 0.5))
    d.rate = math.min(d.ownRate, rrate) * f
  end
  if rburst > 0 then
    set(d, 'reportedBurst', math.floor(rburst * 1e6 + 0.5))
    d.burst = math.min(d.ownBurst, rburst) * f
  end
end

-- report takes what the provider reported of the dimension d into it: the
-- remaining rem (< 0: unknown), the rate rrate and burst rburst (0:
-- unknown), counting for valid microseconds.
local function report(d, rem, rrate, rburst, valid, f)
  if rrate > 0 and rburst > 0 and rem >= 0 then
    reportBucket(d, rem, rrate, rburst, now + valid, f)
  elseif d.providerNow and rem >= 0 then
    -- a report of the provider's bucket that gives no rate (it is full):
    -- the rate it last gave stands
    d.providerNow = math.min(d.providerNow, rem)
    if rburst > 0 then
      -- a limit: the report's own time (a remaining alone says nothing of it)
      d.providerBurst = rburst
      reportUntil(d, now + valid)
      set(d, 'reportedBurst', math.floor(rburst * 1e6 + 0.5))
    end
  else
    reportLimits(d, rem, rrate, rburst, now + valid, f)
  end
end

-- cut debits from the credits of the dimension d what a cut or a pause
-- took, against what time alone would have left by atNow from was (d as
-- refill set it): the waiters' places move no earlier for it. A
-- provider's bucket seeded anew starts a new life.
local function cut(d, was)
  local left = math.min(was.burst, was.tokensNow + (d.atNow - was.atNow) / 1e6 * was.rate)
  if d.tokensNow < left then
    credit(d, 'credit', d.tokensNow - left)
  end
  if d.providerNow and was.providerNow then
    left = math.min(was.providerBurst, was.providerNow + (d.atNow - was.atNow) / 1e6 * was.providerRate)
    if d.providerNow < left then
      credit(d, 'providerCredit', d.providerNow - left)
    end
  elseif d.providerNow then
    credits(d)
    set(d, 'life', (tonumber(d.life) or 0) + 1)
    set(d, 'providerCredit', 0)
  end
end

-- observeDim applies the feedback to dimension key i, at fraction nf after
-- the law and under a pause of pause microseconds (0: none): it returns
-- how long the pause held the dimension past its atNow (0: not).
local function observeDim(i, nf, pause)
  local o = OBS_HEAD + OBS_ARGS*(i-1)
  local d = refill(KEYS[i+1], o, f, 0)
  fold(d) -- before a report writes its fields
  local was = {tokensNow = d.tokensNow, atNow = d.atNow, rate = d.rate, burst = d.burst,
    providerNow = d.providerNow, providerRate = d.providerRate, providerBurst = d.providerBurst}
  local f, paused = f, 0
  if d.window then
    -- a window (WithWindow): not scaled, not paused, not reported on
    f, nf, pause = 1, 1, 0
  end
  if pause > 0 and now + pause > d.atNow then
    paused = pauseDim(d, pause, f, nf)
  end
  report(d, tonumber(ARGV[o + OBS_REMAINING]), tonumber(ARGV[o + OBS_REPORTED_RATE]),
    tonumber(ARGV[o + OBS_REPORTED_BURST]), tonumber(ARGV[o + OBS_REPORTED_FOR]), f)
  d.tokensNow = math.min(d.tokensNow, d.burst * nf / f)
  cut(d, was)
  d.rate, d.burst, d.scale = d.rate * nf / f, d.burst * nf / f, nf
  store(d)
  return paused
end

local nf, changed = learn()
local pause, paused = tonumber(ARGV[OBS_PAUSE]), 0
if pause > 0 and now + pause > pausedTo then
  pausedTo = now + pause
  changed = changed + OBSERVED_PAUSE
  set(law, 'pausedUntil', pausedTo)
  lawExpiry[#lawExpiry+1] = {below = pause / 1000 + 1000, to = math.ceil(pause / 1000) + 1000}
end
for i = 1, #KEYS - 1 do
  paused = math.max(paused, observeDim(i, nf, pause))
end
-- The time paused does not count toward the threshold's window; the count,
-- moved on, must outlive the hash no more than before.
if paused > 0 and (tonumber(law.refused) or 0) > 0 then
  set(law, 'counting', (tonumber(law.counting) or 0) + paused)
  local ttl = math.ceil((law.counting + tonumber(ARGV[OBS_WINDOW]) - now) / 1000) + 1000
  lawExpiry[#lawExpiry+1] = {below = ttl, to = ttl, live = true}
end
saveAll()
saveLaw()
expireLaw()
return changed
`)
