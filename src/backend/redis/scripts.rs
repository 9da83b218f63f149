//! Key names and the Lua scripts that change them. Every change is one atomic
//! script run with EVALSHA (the `redis` crate loads a script on NOSCRIPT).
//!
//! Keys of a name share the hash tag `{STEM}` (the name's escaped stem, which
//! holds no `{`, `}`, `:` or glob character), so Redis Cluster keeps them in
//! one slot and no name's keys or patterns can reach another name's:
//! - `PREFIX:{STEM}:slot:N`: the holder of slot N, a JSON record with a PX TTL;
//! - `PREFIX:{STEM}:fence`: the fence counter, without TTL;
//! - `PREFIX:{STEM}:line`: the waiting line, a sorted set of waiters' tokens by ticket;
//! - `PREFIX:{STEM}:ticket`: the ticket counter;
//! - `PREFIX:{STEM}:widest`: the largest `-p` a run of the name took or waited
//!   with, without TTL: every holder's slot is below it;
//! - `PREFIX:{STEM}:waiter:TOKEN`: a waiter's JSON record, with a PX TTL its waiter refreshes;
//! - `PREFIX:{STEM}:wake:TOKEN`: a short-lived list a waiter BLPOPs, pushed to when it may go.

use redis::Script;

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

    pub fn slots(&self, parallelism: u32) -> impl Iterator<Item = String> + '_ {
        (0..parallelism).map(|slot| self.slot(slot))
    }

    pub fn fence(&self) -> String {
        format!("{}fence", self.base)
    }

    pub fn line(&self) -> String {
        format!("{}line", self.base)
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

/// Shared by the scripts below.
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

-- The numbers of the free slots among `keys[first..]`, slot 0 first, and
-- the one `token` holds already, if any.
local function free_slots(keys, first, token)
  local free, mine = {}, nil
  local marker = '"token":"' .. token .. '"'
  for i = first, #keys do
    local value = redis.call('GET', keys[i])
    if not value then
      table.insert(free, i - first)
    elseif string.find(value, marker, 1, true) then
      mine = i - first
    end
  end
  return free, mine
end

-- Drops the waiters at the head of the line whose places lapsed (they stopped
-- asking); returns the first live one's token, if any.
local function head(line, base)
  while true do
    local token = redis.call('ZRANGE', line, 0, 0)[1]
    if not token or redis.call('EXISTS', base .. 'waiter:' .. token) == 1 then return token end
    redis.call('ZREM', line, token)
  end
end

local function push(base, token, wake_ttl)
  redis.call('LPUSH', base .. 'wake:' .. token, '1')
  redis.call('PEXPIRE', base .. 'wake:' .. token, wake_ttl)
end

-- Wakes the waiter at the head of the line: a slot is free for it.
local function wake(line, base, wake_ttl)
  local token = head(line, base)
  if token then push(base, token, wake_ttl) end
end

-- Wakes the first two waiters after the line moved: the head may take a free
-- slot, the second watches whether the head still lives. Slots go out in
-- line order, one wake at a time; the waiters further back sleep on.
local function wake_front(line, base, wake_ttl)
  head(line, base)
  for _, token in ipairs(redis.call('ZRANGE', line, 0, 1)) do push(base, token, wake_ttl) end
end

-- The `-p` that the name's holders and waiters recorded, if any did (older
-- lockruns did not). They all agree, as this script lets in no other, so the
-- first one found says it. Every holder's slot lies below `widest`.
local function parallelism_in_use(base, line, widest)
  for slot = 0, widest - 1 do
    local theirs = decoded(redis.call('GET', base .. 'slot:' .. slot) or '').parallelism
    if theirs then return theirs end
  end
  for _, token in ipairs(redis.call('ZRANGE', line, 0, -1)) do
    local theirs = decoded(redis.call('GET', base .. 'waiter:' .. token) or '').parallelism
    if theirs then return theirs end
  end
end

-- Redis before 5 replicates scripts, not their effects, and refuses writes after TIME.
if redis.replicate_commands then redis.replicate_commands() end
"#;

/// KEYS: fence, line, ticket, slot 0 .. slot N-1. ARGV: token, holder JSON,
/// waiter JSON, TTL ms, 1 to join the line (0: only look), key base, our boot
/// id, wake TTL ms, our `-p`. A newcomer whose `-p` is not that of the name's
/// holders and waiters gets {2, theirs} and changes nothing (README: "Slots").
/// A slot our token holds already (our last answer was lost) is ours again,
/// for another TTL: {1, slot, its fence}. Else takes a free slot when nobody
/// waits ahead of us: returns {1, slot, fence}
/// (and wakes the next waiter if another slot is free). Else joins (or stays
/// in) the line, keeping our place for another TTL, and returns {0, place (0:
/// not in line), PTTL or -1, {records of holders}, {record of the head}}, the
/// records only for owners on our boot. At the head of the line (or not in
/// it) that is about the holders and the earliest lease's end; second in line,
/// about the head and when its place lapses; further back, nothing.
const ACQUIRE: &str = r#"
local token, base, ttl = ARGV[1], ARGV[6], ARGV[4]
local line = KEYS[2]
local free, mine = free_slots(KEYS, 4, token)
-- Asked again after a lost answer (a connection cut, a failover): the slot is ours already.
if mine then
  local value = redis.call('GET', KEYS[mine + 4])
  redis.call('PEXPIRE', KEYS[mine + 4], ttl)
  return {1, mine, decoded(value).fence, {}, {}}
end
-- Places of waiters that stopped asking lapse here, before anyone counts them.
head(line, base)
local rank = redis.call('ZRANK', line, token)
if not rank then
  local ours = tonumber(ARGV[9])
  local widest = tonumber(redis.call('GET', base .. 'widest') or '0')
  local theirs = parallelism_in_use(base, line, math.max(widest, ours))
  if theirs and theirs ~= ours then return {2, theirs, 0, {}, {}} end
  if ours > widest then redis.call('SET', base .. 'widest', ours) end
end
local ahead = rank or redis.call('ZCARD', line)
if ahead == 0 and #free > 0 then
  if rank then
    redis.call('ZREM', line, token)
    redis.call('DEL', base .. 'waiter:' .. token)
  end
  redis.call('DEL', base .. 'wake:' .. token)
  local slot = free[1]
  local fence = take(KEYS[slot + 4], KEYS[1], ARGV[2], ttl)
  if rank then wake_front(line, base, ARGV[8]) end
  return {1, slot, fence, {}, {}}
end
local place = 0
if rank or ARGV[5] == '1' then
  if not rank then
    redis.call('ZADD', line, redis.call('INCR', KEYS[3]), token)
  end
  redis.call('SET', base .. 'waiter:' .. token, ARGV[3], 'PX', ttl)
  place = ahead + 1
end
local earliest = -1
local holders, before = {}, {}
local marker = '"boot_id":"' .. ARGV[7] .. '"'
local function ours(value)
  return ARGV[7] ~= '' and value and string.find(value, marker, 1, true)
end
if place <= 1 then
  for i = 4, #KEYS do
    local left = redis.call('PTTL', KEYS[i])
    if left >= 0 and (earliest < 0 or left < earliest) then earliest = left end
    local value = redis.call('GET', KEYS[i])
    if ours(value) and not decoded(value).kept_until then table.insert(holders, value) end
  end
elseif place == 2 then
  -- The head: the line moves when its place lapses, if it stopped asking.
  local token_before = redis.call('ZRANGE', line, 0, 0)[1]
  if token_before then
    local key = base .. 'waiter:' .. token_before
    earliest = redis.call('PTTL', key)
    local value = redis.call('GET', key)
    if ours(value) then table.insert(before, value) end
  end
end
return {0, place, earliest, holders, before}
"#;

/// KEYS: line, slot 0 .. slot N-1. ARGV: key base, wake TTL ms, then the tokens
/// of dead entries. Drops each from the line and from any slot it holds (not
/// one kept by `--min-hold`), then wakes the front of the line.
const EVICT: &str = r"
local base = ARGV[1]
for t = 3, #ARGV do
  local token = ARGV[t]
  redis.call('ZREM', KEYS[1], token)
  redis.call('DEL', base .. 'waiter:' .. token, base .. 'wake:' .. token)
  for i = 2, #KEYS do
    local record = decoded(redis.call('GET', KEYS[i]) or '')
    if record.token == token and not record.kept_until then redis.call('DEL', KEYS[i]) end
  end
end
wake_front(KEYS[1], base, ARGV[2])
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

/// KEYS: our slot, line. ARGV: token, keep ms (0: free now), kept-until (epoch
/// ms, for `status`), key base, wake TTL ms. With keep, the slot stays taken
/// that long, marked kept so that no one reclaims it for its holder's process
/// being gone. Otherwise it is freed and the head of the line woken. Returns
/// 1, or 0 when the slot was not (any longer) held with that token.
const RELEASE: &str = r#"
local value = redis.call('GET', KEYS[1])
if not value or decoded(value).token ~= ARGV[1] then return 0 end
if tonumber(ARGV[2]) > 0 then
  redis.call('SET', KEYS[1], '{"kept_until":' .. ARGV[3] .. ',' .. string.sub(value, 2), 'PX', ARGV[2])
  return 1
end
redis.call('DEL', KEYS[1])
wake(KEYS[2], ARGV[4], ARGV[5])
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
        let script = |body: &str| Script::new(&format!("{PRELUDE}{body}"));
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
