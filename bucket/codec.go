package bucket

import (
	"fmt"
	"regexp"
	"strconv"
	"time"
)

// The layout of the token bucket scripts' ARGV and replies (redis_lua.go,
// leaseScript), in one place: positions as Lua numbers them, from 1. The
// scripts name them too: a script's source says ARG_SPAN, DIM_RATE, …, and
// newScript writes each such name as the value of its constant here
// (luaCodec), so that Go and Lua read one layout.
//
// ARGV begins with a head of argHead values: the operation's argument
// (argOp: reserve's maxWait in microseconds, adjust's served, observe's
// verdict; unused elsewhere), the recovery span in microseconds, and the
// law's flags. Then each dimension key has a group of dimArgs values: its
// kind, rate (tokens per second), burst and amount (a lease's size in
// leaseScript, whose groups add what to give back; observe's groups are
// laid out of their own, see obsArgs).
const (
	argOp    = 1 // the operation's argument
	argSpan  = 2 // the recovery span, in microseconds
	argFlags = 3 // the law's flags: flagAdditive, flagCold
	argHead  = 3 // values before the first dimension's group

	dimKind   = 1 // kindBucket or kindWindow
	dimRate   = 2 // tokens per second
	dimBurst  = 3 // tokens
	dimAmount = 4 // tokens: the operation's amount
	dimArgs   = 4 // values per dimension key

	leaseGive = 5 // leaseScript: what to give back of the last lease
	leaseArgs = 5 // values per dimension key of leaseScript

	// A batch (reserveScript, see coalescer): after the first
	// reservation's groups, each further reservation gives its maxWait
	// (batchWait) and then its amount for each dimension key, in order.
	batchWait = 1
)

// The kinds of a dimension (dimKind).
const (
	kindBucket = 0 // a token bucket, scaled by the adaptive law
	kindWindow = 1 // a window (WithWindow): exact, never scaled, never cold
)

// The law's flags (argFlags), added.
const (
	flagAdditive = 1 // the recovery law is additive, not cubic
	flagCold     = 2 // a cold start: a key made anew holds only its first amount
)

// adjustScript's argOp: whether the delta is a served call's (Settle).
const (
	adjustUnserved = 0
	adjustServed   = 1
)

// observeScript's ARGV: a head of obsHead values, then a group of obsArgs
// per dimension key.
const (
	obsVerdict   = 1  // what to learn from refusals: verdictNone, verdictCount, verdictForget
	obsEpoch     = 4  // the epoch the request was reserved in
	obsPause     = 5  // the pause, in microseconds (0: none)
	obsDecrease  = 6  // the decrease factor
	obsFloor     = 7  // the floor
	obsMinEpoch  = 8  // the least time between decreases, in microseconds
	obsThreshold = 9  // refusals that make a decrease
	obsWindow    = 10 // the threshold's window, in microseconds
	obsHold      = 11 // how long a decreased rate must be kept to be known safe, in microseconds
	obsHead      = 11

	// In a group, dimKind, dimRate and dimBurst, then:
	obsRemaining     = 4 // the remaining the provider reported (< 0: unknown)
	obsReportedRate  = 5 // the rate it reported (0: unknown)
	obsReportedBurst = 6 // the burst it reported (0: unknown)
	obsReportedFor   = 7 // how long those count, in microseconds
	obsArgs          = 7
)

// observeScript's verdicts (obsVerdict).
const (
	verdictNone   = 0 // nothing to learn from refusals
	verdictCount  = 1 // a refusal to count
	verdictForget = 2 // forget them: the provider reported its rate
)

// observeScript's reply: these flags, added.
const (
	observedDecrease = 1 // it decreased the rate
	observedPause    = 2 // it set or lengthened a pause
)

// The pins' flags of a reserve script's reply (replyPins), added.
const (
	pinHeld    = 1 // a dimension is held below this process's limit
	pinIgnored = 2 // a pin too far from this process's limit was ignored
)

// A reserve script's reply as a table (reserveScript): the wait, the
// epoch and the pins' flags (pinHeld, pinIgnored), then a place of
// placeFields per dimension key (a wait that may move up), then a window's
// fields (windowFields) per window charged.
const (
	replyWait  = 1
	replyEpoch = 2
	replyPins  = 3
	replyHead  = 3
)

// A place in a reply (place, in the token bucket scripts), per dimension.
const (
	placeWait           = 1 // microseconds until its tokens reach 0
	placeCredit         = 2 // its credit, the hash's string
	placeRate           = 3 // millionths per second, rounded up
	placeFrom           = 4 // microseconds until a pause's end
	placeProviderWait   = 5 // the same of the provider's bucket (-1: none)
	placeProviderCredit = 6
	placeProviderRate   = 7
	placeLife           = 8 // the hash's life, its string
	placePinEnd         = 9 // microseconds until the pin that holds it lapses (0: none)
	placeFields         = 9
)

// A window's fields in a reserve or adjust reply.
const (
	windowTokens = 1 // its tokens after the operation, in millionths
	windowLife   = 2 // its hash's life (0: no hash)
	windowFields = 2
)

// leaseScript's reply.
const (
	leaseGot   = 1 // 1 if it took the lease
	leaseEpoch = 2
	leaseHeld  = 3 // 1 if a dimension is held below this process's limit
	leaseReply = 3
)

// luaCodec is the name in the scripts' source of each constant above.
var luaCodec = map[string]int{
	"ARG_OP": argOp, "ARG_SPAN": argSpan, "ARG_FLAGS": argFlags, "ARG_HEAD": argHead,
	"DIM_KIND": dimKind, "DIM_RATE": dimRate, "DIM_BURST": dimBurst, "DIM_AMOUNT": dimAmount, "DIM_ARGS": dimArgs,
	"LEASE_GIVE": leaseGive, "LEASE_ARGS": leaseArgs, "BATCH_WAIT": batchWait,
	"KIND_WINDOW": kindWindow, "FLAG_ADDITIVE": flagAdditive, "FLAG_COLD": flagCold,
	"ADJUST_SERVED": adjustServed,
	"OBS_VERDICT":   obsVerdict, "OBS_EPOCH": obsEpoch, "OBS_PAUSE": obsPause, "OBS_DECREASE": obsDecrease,
	"OBS_FLOOR": obsFloor, "OBS_MIN_EPOCH": obsMinEpoch, "OBS_THRESHOLD": obsThreshold, "OBS_WINDOW": obsWindow,
	"OBS_HOLD": obsHold, "OBS_HEAD": obsHead, "OBS_REMAINING": obsRemaining, "OBS_REPORTED_RATE": obsReportedRate,
	"OBS_REPORTED_BURST": obsReportedBurst, "OBS_REPORTED_FOR": obsReportedFor, "OBS_ARGS": obsArgs,
	"VERDICT_COUNT": verdictCount, "VERDICT_FORGET": verdictForget,
	"OBSERVED_DECREASE": observedDecrease, "OBSERVED_PAUSE": observedPause,
	"PIN_HELD": pinHeld, "PIN_IGNORED": pinIgnored,
	"REPLY_WAIT": replyWait, "REPLY_EPOCH": replyEpoch, "REPLY_PINS": replyPins,
	"LEASE_GOT": leaseGot, "LEASE_EPOCH": leaseEpoch, "LEASE_HELD": leaseHeld,
	"PLACE_WAIT": placeWait, "PLACE_CREDIT": placeCredit, "PLACE_RATE": placeRate, "PLACE_FROM": placeFrom,
	"PLACE_PROVIDER_WAIT": placeProviderWait, "PLACE_PROVIDER_CREDIT": placeProviderCredit,
	"PLACE_PROVIDER_RATE": placeProviderRate, "PLACE_LIFE": placeLife, "PLACE_PIN_END": placePinEnd,
	"PLACE_FIELDS": placeFields,
}

// codecName is a name of luaCodec in a script's source: capitals with an
// underscore (KEYS and ARGV have none).
var codecName = regexp.MustCompile(`\b[A-Z]+(?:_[A-Z]+)+\b`)

// withCodec is src with each codec name written as its value. It panics on
// a name luaCodec does not have: a script that would read a wrong layout
// never loads.
func withCodec(src string) string {
	return codecName.ReplaceAllStringFunc(src, func(name string) string {
		v, ok := luaCodec[name]
		if !ok {
			panic(fmt.Sprintf("bucket: a script names %s, which the codec does not have", name))
		}
		return strconv.Itoa(v)
	})
}

// scriptHead is the head of a token bucket script's ARGV.
func scriptHead(op, span, flags any) [argHead]any {
	var h [argHead]any
	h[argOp-1], h[argSpan-1], h[argFlags-1] = op, span, flags
	return h
}

// appendDim appends to argv the group of dimension d (dimArgs values),
// whose scripts' number is param (see tokenParam), charged amount.
func appendDim(argv []any, d *dim, param, amount any) []any {
	var g [dimArgs]any
	g[dimKind-1], g[dimRate-1], g[dimBurst-1], g[dimAmount-1] = d.kind(), param, d.burst, amount
	return append(argv, g[:]...)
}

// kind is d's kind as a script argument (dimKind).
func (d *dim) kind() any {
	if d.window() {
		return smallAmounts[kindWindow]
	}
	return smallAmounts[kindBucket]
}

// reserveReply is a reserve script's reply to one reservation.
type reserveReply struct {
	wait    int64 // in microseconds; negated if refused
	epoch   uint64
	pins    int64        // the pins' flags (pinHeld, pinIgnored)
	place   []constraint // of a wait that may move up
	windows []windowReply
}

// windowReply is what a reserve or adjust script's reply says of a window
// the operation took from (see windowsSeen).
type windowReply struct {
	tokens float64 // after the operation
	life   int64   // the hash's life: the time it was made; 0: none
}

// reservation reads a reserve script's reply over dims dimension keys, of
// which windows are windows (WithWindow) it charged: the wait in
// microseconds, or the wait and the key's epoch, and then the pins' flags
// (pinHeld, pinIgnored) if any; or, for a wait that may move up, the wait,
// the epoch, the pins' flags, and the reservation's place. With windows,
// always a table whose last windowFields*windows fields are each window's.
func reservation(v any, dims, windows int) (reserveReply, error) {
	switch v := v.(type) {
	case int64:
		if windows == 0 {
			return reserveReply{wait: v}, nil
		}
	case []any:
		if rep, ok := reservationTable(v, dims, windows); ok {
			return rep, nil
		}
	}
	return reserveReply{}, fmt.Errorf("unexpected reply %v", v)
}

// reservationTable is reservation of a reply that is a table, and whether
// it is one the scripts give.
func reservationTable(v []any, dims, windows int) (reserveReply, bool) {
	tail := windowFields * windows
	if len(v) < replyEpoch+min(windows, 1)+tail {
		return reserveReply{}, false // not indexed
	}
	ws, ok := windowsOf(v[len(v)-tail:])
	v = v[:len(v)-tail]
	w, ok1 := v[replyWait-1].(int64)
	e, ok2 := v[replyEpoch-1].(int64)
	pins, ok3 := pinsOf(v)
	if !ok || !ok1 || !ok2 || !ok3 || e < 0 {
		return reserveReply{}, false
	}
	rep := reserveReply{wait: w, epoch: uint64(e), pins: pins, windows: ws}
	switch {
	case len(v) == replyEpoch && windows == 0 || len(v) == replyHead && (pins != 0 || windows > 0):
		return rep, true
	case len(v) == replyHead+placeFields*dims && w > 0:
		var err error
		rep.place, err = places(v[replyHead:], time.Now())
		return rep, err == nil
	}
	return reserveReply{}, false
}

// windowsOf reads the windows' fields of a reserve or adjust script's
// reply: each one's tokens in millionths and its life; and whether they
// are valid.
func windowsOf(v []any) ([]windowReply, bool) {
	if len(v) == 0 {
		return nil, true
	}
	ws := make([]windowReply, len(v)/windowFields)
	for i := range ws {
		f := v[windowFields*i:]
		tk, ok1 := f[windowTokens-1].(int64)
		life, ok2 := f[windowLife-1].(int64)
		if !ok1 || !ok2 || life < 0 {
			return nil, false
		}
		ws[i] = windowReply{tokens: float64(tk) / 1e6, life: life}
	}
	return ws, true
}

// pinsOf reads the pins' flags of a reserve script's reply v: 0 if it has
// none; and whether they are valid.
func pinsOf(v []any) (int64, bool) {
	if len(v) < replyPins {
		return 0, true
	}
	pins, ok := v[replyPins-1].(int64)
	return pins, ok && pins >= 0 && pins <= pinHeld|pinIgnored
}

// places reads the places of a reply (place, in the token bucket scripts),
// as of at, which it was read at: for each dimension, its own bucket's
// then the provider's.
func places(v []any, at time.Time) ([]constraint, error) {
	if len(v)%placeFields != 0 {
		return nil, fmt.Errorf("%d fields of places", len(v))
	}
	cs := make([]constraint, 0, 2*len(v)/placeFields)
	for i := 0; i < len(v); i += placeFields {
		own, prov, err := placeOf(v[i:i+placeFields], at)
		if err != nil {
			return nil, err
		}
		cs = append(cs, own, prov)
	}
	return cs, nil
}

// placeOf reads one dimension's place, f, as of at: its own bucket's
// constraint and the provider's.
func placeOf(f []any, at time.Time) (own, prov constraint, err error) {
	// The integers, each at least 0, but the provider's wait (-1: none).
	var n [placeFields + 1]int64
	for _, i := range [...]int{placeWait, placeRate, placeFrom, placeProviderWait, placeProviderRate, placePinEnd} {
		v, ok := f[i-1].(int64)
		if !ok || v < -1 || v == -1 && i != placeProviderWait {
			return own, prov, fmt.Errorf("a place %v", f)
		}
		n[i] = v
	}
	life, ok := f[placeLife-1].(string)
	credit, err1 := creditOf(f[placeCredit-1])
	pcredit, err2 := creditOf(f[placeProviderCredit-1])
	if !ok || err1 != nil || err2 != nil {
		return own, prov, fmt.Errorf("a place %v", f)
	}
	when := func(us int64) time.Time { return at.Add(micros(us)) }
	from := when(n[placeFrom])
	own = constraint{ok: true, at: when(n[placeWait]), from: from, credit: credit, rate: float64(n[placeRate]) / 1e6, life: life}
	if n[placePinEnd] > 0 {
		own.pinned = when(n[placePinEnd])
	}
	prov = constraint{ok: n[placeProviderWait] >= 0, at: when(max(n[placeProviderWait], 0)), from: from,
		credit: pcredit, rate: float64(n[placeProviderRate]) / 1e6, life: life}
	return own, prov, nil
}

// creditOf reads a credit: an integer of millionths, as Redis wrote it.
func creditOf(v any) (int64, error) {
	s, ok := v.(string)
	if !ok {
		return 0, fmt.Errorf("a credit %v", v)
	}
	return strconv.ParseInt(s, 10, 64)
}
