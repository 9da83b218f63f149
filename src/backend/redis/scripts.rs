//! Key names and the Lua scripts that change them. Every change is one atomic
//! script run with EVALSHA (the `redis` crate loads a script on NOSCRIPT).
//!
//! Keys of a name share the hash tag `{STEM}` (the name's escaped stem, which
//! holds no `{`, `}`, `:` or glob character), so Redis Cluster keeps them in
//! one slot and no name's keys or patterns can reach another name's:
//! - `PREFIX:{STEM}:slot:N`: the holder of slot N, a JSON record with a PX TTL;
//! - `PREFIX:{STEM}:format`: the format of the name's keys ([`FORMAT`]), without TTL;
//! - `PREFIX:{STEM}:fence`: the fence counter, without TTL;
//! - `PREFIX:{STEM}:line`: the waiting line, a sorted set of waiters' tokens by ticket;
//! - `PREFIX:{STEM}:sharers`: the shared waiters of the line, by the same tickets;
//! - `PREFIX:{STEM}:ticket`: the ticket counter;
//! - `PREFIX:{STEM}:widest`: one more than the highest slot taken, without
//!   TTL: every holder's slot is below it (older lockruns also raised it to
//!   the `-p` of every run that looked);
//! - `PREFIX:{STEM}:waiter:TOKEN`: a waiter's JSON record, with a PX TTL its waiter refreshes;
//! - `PREFIX:{STEM}:wake:TOKEN`: a short-lived list a waiter BLPOPs, pushed to when it may go;
//! - `PREFIX:{STEM}:released:TOKEN`: set by a release for as long as the
//!   release may be made again (its answer lost), which then knows it was done.

use redis::Script;

/// The format of a name's keys, bumped when they change in a way an older
/// lockrun would misread; kept in `PREFIX:{STEM}:format`, which the acquire
/// script reads, so it costs no round trip.
pub const FORMAT: u32 = 1;

use crate::backend::MAX_SHARERS;
use crate::name::Name;

pub struct RedisKeys {
    /// `PREFIX:{STEM}:`
    base: String,
}

impl RedisKeys {
    pub fn new(prefix: &str, name: &Name) -> Self {
        Self {
            base: format!("{prefix}:{{{}}}:", name.stem()),
        }
    }

    /// The keys whose base (`PREFIX:{STEM}:`) is `base`, as found by a SCAN.
    pub fn from_base(base: &str) -> Self {
        Self {
            base: base.to_owned(),
        }
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    pub fn slot(&self, slot: u32) -> String {
        format!("{}slot:{slot}", self.base)
    }

    pub fn format(&self) -> String {
        format!("{}format", self.base)
    }

    pub fn fence(&self) -> String {
        format!("{}fence", self.base)
    }

    pub fn line(&self) -> String {
        format!("{}line", self.base)
    }

    pub fn sharers(&self) -> String {
        format!("{}sharers", self.base)
    }

    pub fn widest(&self) -> String {
        format!("{}widest", self.base)
    }

    pub fn ticket(&self) -> String {
        format!("{}ticket", self.base)
    }

    pub fn waiter(&self, token: &str) -> String {
        format!("{}waiter:{token}", self.base)
    }

    pub fn wake(&self, token: &str) -> String {
        format!("{}wake:{token}", self.base)
    }

    /// A SCAN pattern for the slot keys of this name.
    pub fn slot_pattern(&self) -> String {
        format!("{}*", glob_escape(&format!("{}slot:", self.base)))
    }
}

/// A SCAN pattern for the keys of every name under `prefix` that end in `suffix` (`slot:*`, `line`).
pub fn every_name(prefix: &str, suffix: &str) -> String {
    format!("{}:{{*}}:{suffix}", glob_escape(prefix))
}

/// The base (`PREFIX:{STEM}:`) and slot of a slot key under `prefix`.
pub fn parse_slot_key<'k>(prefix: &str, key: &'k str) -> Option<(&'k str, u32)> {
    let rest = key.strip_prefix(prefix)?.strip_prefix(":{")?;
    let (stem, slot) = rest.split_once("}:slot:")?;
    let base = &key[..prefix.len() + 2 + stem.len() + 2];
    Some((base, slot.parse().ok()?))
}

fn glob_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// Shared by the scripts below (after `MAX_SHARERS`, set from Rust's constant).
const PRELUDE: &str = r#"
local function decoded(value)
  local ok, record = pcall(cjson.decode, value)
  if ok and type(record) == 'table' then return record end
  return {}
end

-- One more than the last fence, and never below the server clock in microseconds:
-- if Redis loses the counter (a restart without persistence, a failover to a
-- lagging replica), new fences still exceed the ones handed out before.
local function next_fence(key)
  local now = redis.call('TIME')
  local floor = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local fence = redis.call('INCR', key)
  if fence < floor then
    redis.call('SET', key, string.format('%d', floor))
    fence = floor
  end
  return fence
end

-- Makes the holder described by the JSON object `meta` the holder of `key` for `ttl` ms.
local function take(key, fence_key, meta, ttl)
  local fence = next_fence(fence_key)
  redis.call('SET', key, '{"fence":' .. string.format('%d', fence) .. ',' .. string.sub(meta, 2), 'PX', ttl)
  return fence
end

-- One more than the highest slot any holder may be in: slots 0 .. widest - 1 hold them all.
local function widest_slot(key)
  return tonumber(redis.call('GET', key) or '0')
end

-- The holders of slots 0 .. span - 1, by slot number: each its JSON and its record.
local function holders(base, span)
  local held = {}
  for slot = 0, span - 1 do
    local value = redis.call('GET', base .. 'slot:' .. slot)
    if value then held[slot] = {value = value, record = decoded(value)} end
  end
  return held
end

-- Drops the waiters at the head of the line whose places lapsed (they stopped
-- asking); true when it dropped any: the line moved.
local function drop_lapsed(line, sharers, base)
  local dropped = false
  while true do
    local token = redis.call('ZRANGE', line, 0, 0)[1]
    if not token or redis.call('EXISTS', base .. 'waiter:' .. token) == 1 then return dropped end
    redis.call('ZREM', line, token)
    redis.call('ZREM', sharers, token)
    dropped = true
  end
end

-- The waiters that go first: the head and, when it is shared, the shared
-- waiters right behind it, who go with it (at most MAX_SHARERS); then the
-- waiter after them, if any.
local function front(line, sharers)
  local head = redis.call('ZRANGE', line, 0, 0)[1]
  if not head then return {}, nil end
  local group = {head}
  if not redis.call('ZSCORE', sharers, head) then
    return group, redis.call('ZRANGE', line, 1, 1)[1]
  end
  while true do
    local token = redis.call('ZRANGE', line, #group, #group)[1]
    if not token or not redis.call('ZSCORE', sharers, token) or #group == MAX_SHARERS then
      return group, token
    end
    table.insert(group, token)
  end
end

local function wake(base, tokens, wake_ttl)
  for _, token in ipairs(tokens) do
    redis.call('LPUSH', base .. 'wake:' .. token, '1')
    redis.call('PEXPIRE', base .. 'wake:' .. token, wake_ttl)
  end
end

-- Wakes the front after the line moved: the head (with its sharers) may take
-- a free slot, the waiter after them watches whether they still live. Slots
-- go out in line order; the waiters further back sleep on.
local function wake_front(line, sharers, base, wake_ttl)
  local group, after = front(line, sharers)
  if after then table.insert(group, after) end
  wake(base, group, wake_ttl)
end

-- The `-p` that the name's holders (`held`) and waiters recorded, if any did
-- (older lockruns did not). They all agree, as this script lets in no
-- other, so the first one found says it.
local function parallelism_in_use(held, line, base)
  for _, holder in pairs(held) do
    if holder.record.parallelism then return holder.record.parallelism end
  end
  for _, token in ipairs(redis.call('ZRANGE', line, 0, -1)) do
    local theirs = decoded(redis.call('GET', base .. 'waiter:' .. token) or '').parallelism
    if theirs then return theirs end
  end
end

-- Request::admitted in Rust (docs/guide.md: "Shared locks"): a run that holds alone
-- needs fewer than `capacity` holders and nobody ahead; a shared one needs no
-- holder that holds alone, fewer than `capacity` holders, and only sharers
-- ahead (`ahead` waiters, `shared_ahead` of them shared).
local function admitted(shared, capacity, held, ahead, shared_ahead)
  local count = 0
  for _, holder in pairs(held) do
    if shared and holder.record.mode ~= 'shared' then return false end
    count = count + 1
  end
  return count < capacity and (ahead == 0 or (shared and shared_ahead == ahead))
end

-- The lowest slot below `capacity` that nobody in `held` holds.
local function lowest_free(held, capacity)
  for slot = 0, capacity - 1 do
    if not held[slot] then return slot end
  end
end

-- Redis before 5 replicates scripts, not their effects, and refuses writes after TIME.
if redis.replicate_commands then redis.replicate_commands() end
"#;

/// KEYS: fence, line, ticket, sharers, widest. Keys of a newer format (a newer
/// lockrun's) are left untouched: {3, their format}. ARGV: token, holder JSON, waiter
/// JSON, TTL ms, 1 to join the line (0: only look), key base, our boot id, wake
/// TTL ms, our `-p`, our mode. A newcomer whose `-p` is not that of the name's
/// holders and waiters gets {2, theirs} and changes nothing (docs/guide.md: "Slots").
/// A slot our token holds already (our last answer was lost) is ours again,
/// for another TTL: {1, slot, its fence}. Else takes the lowest free slot when
/// `admitted` lets us (the modes of the holders and of the waiters ahead):
/// {1, slot, fence}. Else joins (or stays in) the line, keeping our place for
/// another TTL, and returns {0, place (0: not in line), PTTL or -1, {records}},
/// the records only of owners on our boot: at the head of the line (or not in
/// it, or among the sharers at its head) the holders and the earliest lease's
/// end; right behind the head (one waiter, or the sharers there), those
/// waiters and when the first of their places lapses; with none of those on
/// our boot, the record of the waiter on our boot nearest ahead (or, with
/// none, our boot's holders).
const ACQUIRE: &str = r#"
local token, base, ttl = ARGV[1], ARGV[6], ARGV[4]
local ours, shared = tonumber(ARGV[9]), ARGV[10] == 'shared'
local fence_key, line, ticket, sharers, widest_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local format = redis.call('GET', base .. 'format')
if not format then
  redis.call('SET', base .. 'format', FORMAT)
elseif format ~= tostring(FORMAT) then
  local theirs = tonumber(format) or -1
  if theirs < 0 or theirs > FORMAT then return {3, theirs, 0, {}} end
end
local widest = widest_slot(widest_key)
local held = holders(base, math.max(widest, ours))
-- Asked again after a lost answer (a connection cut, a failover): the slot is ours already.
for slot, holder in pairs(held) do
  if holder.record.token == token then
    redis.call('PEXPIRE', base .. 'slot:' .. slot, ttl)
    return {1, slot, holder.record.fence, {}}
  end
end
-- Places of waiters that stopped asking lapse here, before anyone counts them.
local moved = drop_lapsed(line, sharers, base)
local rank = redis.call('ZRANK', line, token)
if not rank then
  local theirs = parallelism_in_use(held, line, base)
  if theirs and theirs ~= ours then return {2, theirs, 0, {}} end
end
local ahead = rank or redis.call('ZCARD', line)
local shared_ahead = 0
if rank and rank > 0 then
  shared_ahead = redis.call('ZCOUNT', sharers, '-inf', '(' .. redis.call('ZSCORE', line, token))
elseif not rank then
  shared_ahead = redis.call('ZCARD', sharers)
end
local capacity = ours
if shared then capacity = MAX_SHARERS end
local slot = admitted(shared, capacity, held, ahead, shared_ahead) and lowest_free(held, capacity)
local wake_key = base .. 'wake:' .. token
if slot then
  if rank then
    redis.call('ZREM', line, token)
    redis.call('ZREM', sharers, token)
    redis.call('DEL', base .. 'waiter:' .. token)
  end
  redis.call('DEL', wake_key)
  if slot >= widest then redis.call('SET', widest_key, slot + 1) end
  local fence = take(base .. 'slot:' .. slot, fence_key, ARGV[2], ttl)
  -- The sharers left at the head know already; after the last of them, or a
  -- run that holds alone, the next ones must learn what they now wait for.
  local head = redis.call('ZRANGE', line, 0, 0)[1]
  if moved or (rank and head and not (shared and redis.call('ZSCORE', sharers, head))) then
    wake_front(line, sharers, base, ARGV[8])
  end
  return {1, slot, fence, {}}
end
local place = 0
if rank or ARGV[5] == '1' then
  if not rank then
    local number = redis.call('INCR', ticket)
    redis.call('ZADD', line, number, token)
    if shared then redis.call('ZADD', sharers, number, token) end
  end
  redis.call('SET', base .. 'waiter:' .. token, ARGV[3], 'PX', ttl)
  place = ahead + 1
end
if moved then wake_front(line, sharers, base, ARGV[8]) end
-- What this look saw makes any wake-up sent to us so far old news.
redis.call('DEL', wake_key)
local earliest = -1
local watched = {}
local marker = '"boot_id":"' .. ARGV[7] .. '"'
local function watch(key, value)
  local left = redis.call('PTTL', key)
  if left >= 0 and (earliest < 0 or left < earliest) then earliest = left end
  if ARGV[7] ~= '' and value and string.find(value, marker, 1, true) then
    table.insert(watched, value)
  end
end
if place <= 1 or (shared and shared_ahead == ahead) then
  for number, holder in pairs(held) do
    -- A slot kept by --min-hold has no process to watch, only its end.
    local value = holder.value
    if holder.record.kept_until then value = nil end
    watch(base .. 'slot:' .. number, value)
  end
elseif ahead == 1 or shared_ahead == ahead then
  -- The line moves when the place of one of them lapses, if it stopped asking.
  for _, before in ipairs(redis.call('ZRANGE', line, 0, ahead - 1)) do
    local key = base .. 'waiter:' .. before
    watch(key, redis.call('GET', key))
  end
end
-- Nothing of our host there: the waiter of our host nearest ahead of us (or,
-- with none, our host's holders) is ours to watch. As each waiter watches the
-- nearest one of its host, dead entries of a host are seen however many died
-- together (docs/guide.md: "The waiting line"); it changes no moment to look again.
if #watched == 0 and place > 1 and ARGV[7] ~= '' then
  local tokens = redis.call('ZRANGE', line, 0, ahead - 1)
  for i = #tokens, 1, -1 do
    local value = redis.call('GET', base .. 'waiter:' .. tokens[i])
    if value and string.find(value, marker, 1, true) then
      table.insert(watched, value)
      break
    end
  end
  if #watched == 0 then
    for _, holder in pairs(held) do
      if not holder.record.kept_until and string.find(holder.value, marker, 1, true) then
        table.insert(watched, holder.value)
      end
    end
  end
end
return {0, place, earliest, watched}
"#;

/// KEYS: line, sharers, widest. ARGV: key base, wake TTL ms, then the tokens of
/// dead entries. Drops each from the line and from any slot it holds (not one
/// kept by `--min-hold`), then wakes the front of the line.
const EVICT: &str = r"
local line, sharers, base = KEYS[1], KEYS[2], ARGV[1]
local dead = {}
for t = 3, #ARGV do
  local token = ARGV[t]
  dead[token] = true
  redis.call('ZREM', line, token)
  redis.call('ZREM', sharers, token)
  redis.call('DEL', base .. 'waiter:' .. token, base .. 'wake:' .. token)
end
for slot, holder in pairs(holders(base, widest_slot(KEYS[3]))) do
  if dead[holder.record.token] and not holder.record.kept_until then
    redis.call('DEL', base .. 'slot:' .. slot)
  end
end
wake_front(line, sharers, base, ARGV[2])
return 1
";

/// KEYS: slot. ARGV: token, TTL ms. 1 when renewed; 0 when the lease is gone
/// (expired or taken over): a lapsed lease is never re-created.
const RENEW: &str = r"
local value = redis.call('GET', KEYS[1])
if value and decoded(value).token == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
";

/// KEYS: our slot, line, sharers, widest. ARGV: token, keep ms (0: free now),
/// kept-until (epoch ms, for `status`), key base, wake TTL ms, how long to
/// remember the release (ms; 0: not). With keep, the slot stays taken that
/// long, marked kept so that no one reclaims it for its holder's process being
/// gone. Otherwise it is freed and the waiters it is for woken (the head of
/// the line, or every sharer at its head at once; none when a sharer leaves
/// others holding before a waiter that holds alone). Returns 1, or
/// 0 when the slot was not (any longer) held with that token. A place in
/// line with that token goes too (a failover brought it back). A remembered
/// release made again after its answer was lost finds it done: that tells it
/// from a lease lost before it (expired, or broken by `release --force`,
/// which remembers nothing).
const RELEASE: &str = r#"
local token, base, remember = ARGV[1], ARGV[4], tonumber(ARGV[6])
local released = base .. 'released:' .. token
-- A place of ours in line is one a failover brought back (we took the slot
-- on a primary that was being demoted): it goes with the release.
local placed = redis.call('ZREM', KEYS[2], token) == 1
if placed then
  redis.call('ZREM', KEYS[3], token)
  redis.call('DEL', base .. 'waiter:' .. token)
end
local value = redis.call('GET', KEYS[1])
local record = decoded(value or '')
if not value or record.token ~= token then
  if placed then wake_front(KEYS[2], KEYS[3], base, ARGV[5]) end
  if remember > 0 then return redis.call('EXISTS', released) end
  return 0
end
if remember > 0 then redis.call('SET', released, '1', 'PX', remember) end
if tonumber(ARGV[2]) > 0 then
  if placed then wake_front(KEYS[2], KEYS[3], base, ARGV[5]) end
  -- Kept already: this is the same release made again.
  if not record.kept_until then
    redis.call('SET', KEYS[1], '{"kept_until":' .. ARGV[3] .. ',' .. string.sub(value, 2), 'PX', ARGV[2])
  end
  return 1
end
redis.call('DEL', KEYS[1])
local group = front(KEYS[2], KEYS[3])
local alone = group[1] and not redis.call('ZSCORE', KEYS[3], group[1])
if not (alone and record.mode == 'shared' and next(holders(base, widest_slot(KEYS[4])))) then
  wake(base, group, ARGV[5])
end
return 1
"#;

pub struct Scripts {
    pub acquire: Script,
    pub evict: Script,
    pub renew: Script,
    pub release: Script,
}

impl Scripts {
    pub fn new() -> Self {
        let script = |body: &str| {
            Script::new(&format!(
                "local MAX_SHARERS, FORMAT = {MAX_SHARERS}, {FORMAT}\n{PRELUDE}{body}"
            ))
        };
        Self {
            acquire: script(ACQUIRE),
            evict: script(EVICT),
            renew: script(RENEW),
            release: script(RELEASE),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_name_reaches_another_names_keys() {
        let name = Name::parse("nightly}:slot:7 [x]*?").unwrap();
        let keys = RedisKeys::new("app*", &name);
        let slot = keys.slot(12);
        assert_eq!(slot, "app*:{nightly%7D%3Aslot%3A7%20%5Bx%5D%2A%3F}:slot:12");
        assert_eq!(parse_slot_key("app*", &slot), Some((keys.base(), 12)));
        assert_eq!(
            keys.slot_pattern(),
            r"app\*:{nightly%7D%3Aslot%3A7%20%5Bx%5D%2A%3F}:slot:*"
        );
        assert_eq!(every_name("a?", "line"), r"a\?:{*}:line");
        assert_eq!(parse_slot_key("other", &slot), None);
        let short = RedisKeys::new("p", &Name::parse("x").unwrap());
        assert!(!keys.slot(0).starts_with(short.base()));
    }
}
