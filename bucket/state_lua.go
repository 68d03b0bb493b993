package bucket

import (
	"strconv"
	"strings"
)

// The token bucket scripts keep one HASH per key and dimension, whose
// fields the scripts name as Local does (dimFields gives each name the
// field that stores it):
//
//	tokens            in millionths (an integer), negative while in debt
//	at                the time tokens are as of, in microseconds of Redis
//	                  TIME; in the future while the key is paused (tokens
//	                  are then at most 0)
//	expires           when the hash is set to expire, in microseconds
//	reportedRate      the rate the provider reported, in millionths per
//	                  second (optional)
//	reportedBurst     the burst the provider reported, in millionths
//	                  (optional)
//	reportedUntil     until when reportedRate and reportedBurst count, in
//	                  microseconds (with either)
//	provider          the provider's tokens in millionths, as of at: its
//	                  bucket, at reportedRate up to reportedBurst (with
//	                  both, when a report gave its remaining)
//	pinnedRate        the lowest rate a process of the fleet is configured
//	                  with, in millionths per second, until pinnedRateUntil
//	                  (microseconds); pinnedBurst, pinnedBurstUntil the same
//	                  of the burst, in millionths (see pinned)
//	credit            the credit of tokens: in millionths, what has been
//	                  added to tokens other than by time, net of what has
//	                  been taken other than by reservations: the refunds of
//	                  calls served (adjust, served), less every debit and
//	                  every cut that a report or a pause made (optional: 0)
//	providerCredit    the same of provider (optional: 0)
//	life              the hash's life: the time the hash was made, in
//	                  microseconds, raised when provider is seeded anew (its
//	                  credit starts again) or the credits start again from 0
//	                  (optional: 0)
//
// A reservation's waiter moves up by the credit given since it reserved
// (see place in bucket.go): what a served call gave back is capacity that
// every reservation still waiting had counted as taken.
//
// and one HASH per key, KEYS[1], for what the adaptive law needs (lawFields):
//
//	epoch        how many decreases so far
//	after        the fraction of the ceiling just after the last decrease,
//	             in millionths
//	decreased    when the last decrease happened, in microseconds
//	refused      refusals counted toward the next decrease
//	counting     when that count began, in microseconds, moved on by the
//	             pauses since
//	pausedUntil  when the last pause ends, in microseconds
//
// A script loads each hash it reads once, into a table with these names
// (luaLoad, luaLoadLaw), applies its rules to the tables, and saves each
// once at its end: the fields it changed (set), in one HSET, those it
// deleted in one HDEL, and the expiry if it moved (saveAll, saveLaw). A
// batch of reservations (see reserveScript) so reads and writes each hash
// once.

// stateField is a field of a hash of the token bucket scripts: its name in
// the scripts and in Local, and the field of the hash that stores it.
type stateField struct{ name, field string }

// dimFields are the fields of a dimension's hash that every rule reads,
// in the order the scripts read them; dimCredits those that only a
// waiter's place, a credit and a new life read, which a script reads when
// it first needs them (see credits): three fields more in every read cost
// about 6 K Redis instructions a call. With lawFields, they are the only
// place a stored field's name is written.
var (
	dimFields = []stateField{
		{"tokens", "t"}, {"at", "ts"}, {"expires", "x"},
		{"reportedRate", "r"}, {"reportedBurst", "b"}, {"reportedUntil", "rx"}, {"provider", "p"},
		{"pinnedRate", "cr"}, {"pinnedRateUntil", "crx"}, {"pinnedBurst", "cb"}, {"pinnedBurstUntil", "cbx"},
	}
	dimCredits = []stateField{{"credit", "f"}, {"providerCredit", "fp"}, {"life", "i"}}
)

// lawFields are the fields of a key's adaptive state (KEYS[1]); every
// script reads the first four (lawRead), the observe script all.
var lawFields = []stateField{
	{"epoch", "e"}, {"after", "a"}, {"decreased", "d"}, {"pausedUntil", "p"},
	{"refused", "c"}, {"counting", "cs"},
}

// lawRead are the fields of the adaptive state that every script reads.
var lawRead = lawFields[:4]

// dimNow are the fields a dimension's table holds beside its state: its
// key and whether its credits were read (see credits), then what refill
// sets (see refill in redis_lua.go): the dimension as of now, and the
// operation's amount. They are never saved; the loader gives each a slot,
// so that filling them grows no table.
var dimNow = []string{
	"key", "creditsRead", "window", "rate", "burst", "tokensNow", "atNow", "expiresNow", "reportedNow",
	"providerNow", "providerRate", "providerBurst", "pin", "pinEnd",
	"ownRate", "ownBurst", "scale", "fold", "amount",
}

// luaState defines set; loaded, credits and saveAll, for the dimensions'
// states (see luaLoad, which loads one). The loaders and savers are
// written out from dimFields, dimCredits and lawFields: a constant HMGET
// and one table constructor, and a test per field in a save. A Lua table
// that maps names to fields is built anew by every call of a script: two
// of them cost about 7 K Redis instructions a call (callgrind,
// compat/internal/scriptcost).
var luaState = `
-- set sets the field name of a loaded state s to v (false: delete it),
-- to be written when the state is saved.
local function set(s, name, v)
  s[name] = v
  local c = s.changed
  if not c then
    c = {tokens = false, at = false, expires = false} -- the names a store sets
    s.changed = c
  end
  c[name] = true
end

-- loaded holds the state of each dimension key the script read, loaded
-- once (see luaLoad, in refill): in a batch (see reserveScript) the reservations after
-- the first read what those before them set, and every state is written
-- once, at the script's end (saveAll).
local loaded = {}

` + luaCredits() + luaSaveAll()

// luaLawSave defines saveLaw, which writes what changed of law.
var luaLawSave = `
-- saveLaw writes what the script changed of the law's state: the fields
-- deleted in one HDEL, then those set in one HSET.
local function saveLaw()
  local c = law.changed
  if not c then
    return
  end
  local w, del = {}, {}
` + luaPuts("law", lawFields) + `  if #del > 0 then redis.call('HDEL', KEYS[1], unpack(del)) end
  if #w > 0 then redis.call('HSET', KEYS[1], unpack(w)) end
end
`

// luaHMGET is an HMGET of key's fields fs, into the local s.
func luaHMGET(key string, fs []stateField) string {
	var b strings.Builder
	b.WriteString("local s = redis.call('HMGET', " + key)
	for _, f := range fs {
		b.WriteString(", '" + f.field + "'")
	}
	b.WriteString(")\n")
	return b.String()
}

// luaFields is a table constructor's fields: each of fs's names from s,
// then each of extra, false.
func luaFields(fs []stateField, extra []string) string {
	var b strings.Builder
	for i, f := range fs {
		b.WriteString(f.name + " = s[" + strconv.Itoa(i+1) + "], ")
	}
	for _, n := range extra {
		b.WriteString(n + " = false, ")
	}
	return b.String()
}

// luaLoadLaw loads the fields fs of KEYS[1] into the table law, with
// changed (the names set since; false: none).
func luaLoadLaw(fs []stateField) string {
	return "local law\ndo\n  " + luaHMGET("KEYS[1]", fs) +
		"  law = {" + luaFields(fs, []string{"changed"}) + "}\nend\n"
}

// luaLoad loads the state of the dimension key, once, into the local d: its
// fields by name (false where missing; the credits nil until read, see
// credits), changed (the names set since it was loaded; false: none), and
// the slots of what refill sets (dimNow).
var luaLoad = `local d = loaded[key]
  if not d then
    ` + luaHMGET("key", dimFields) + `    d = {` + luaFields(dimFields, append([]string{"changed"}, dimNow...)) +
	luaFieldsNil(dimCredits) + `}
    d.key = key
    loaded[key] = d
  end
`

// luaFieldsNil is a table constructor's fields: each of fs's names, nil
// (a slot, filled later without growing the table).
func luaFieldsNil(fs []stateField) string {
	var b strings.Builder
	for _, f := range fs {
		b.WriteString(f.name + " = nil, ")
	}
	return b.String()
}

// luaCredits defines credits(d).
func luaCredits() string {
	var b strings.Builder
	b.WriteString(`
-- credits reads the credits and the life of the dimension d (dimCredits)
-- the first time they are needed, keeping those the script set already.
local function credits(d)
  if d.creditsRead then
    return
  end
  d.creditsRead = true
  local c = d.changed or {}
  `)
	b.WriteString(luaHMGET("d.key", dimCredits))
	for i, f := range dimCredits {
		b.WriteString("  if not c." + f.name + " then d." + f.name + " = s[" + strconv.Itoa(i+1) + "] end\n")
	}
	b.WriteString("end\n")
	return b.String()
}

// luaSaveAll defines saveAll.
func luaSaveAll() string {
	return `
-- saveAll writes what changed of each dimension's state: the fields
-- deleted in one HDEL, then those set in one HSET, then the expiry if it
-- moved; or deletes a hash dropped (see adjustScript).
local function saveAll()
  for key, d in pairs(loaded) do
    local c = d.changed
    if d.dropped then
      redis.call('DEL', key)
    elseif c then
      local w, del = {}, {}
` + luaPuts("d", append(dimFields[:len(dimFields):len(dimFields)], dimCredits...)) + `      if #del > 0 then redis.call('HDEL', key, unpack(del)) end
      if #w > 0 then redis.call('HSET', key, unpack(w)) end
      if c.expires then redis.call('PEXPIREAT', key, math.ceil(d.expires / 1000)) end
    end
  end
end
`
}

// luaPuts adds each of fs, from the table s, that changed (c), to the
// fields to write, w, or if false to those to delete, del.
func luaPuts(s string, fs []stateField) string {
	var b strings.Builder
	for _, f := range fs {
		v := s + "." + f.name
		b.WriteString("      if c." + f.name + " then if " + v + " then w[#w+1] = '" + f.field + "'; w[#w+1] = " + v +
			" else del[#del+1] = '" + f.field + "' end end\n")
	}
	return b.String()
}
