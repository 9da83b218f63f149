//! Key names and the Lua scripts that change them. Every change is one atomic
//! script run with EVALSHA (the `redis` crate loads a script on NOSCRIPT).
//!
//! Keys of a name share the hash tag `{NAME}`, so Redis Cluster keeps them in one slot:
//! - `PREFIX:{NAME}:slot:N`: the holder of slot N, a JSON record with a PX TTL;
//! - `PREFIX:{NAME}:fence`: the fence counter, without TTL;
//! - `PREFIX:{NAME}:wake`: a short-lived list that release pushes to and waiters BLPOP.

use redis::Script;

use crate::name::Name;

pub struct Keys {
    /// `PREFIX:{NAME}:`
    base: String,
}

impl Keys {
    pub fn new(prefix: &str, name: &Name) -> Self {
        Self {
            base: format!("{prefix}:{{{name}}}:"),
        }
    }

    pub fn slot(&self, slot: u32) -> String {
        format!("{}slot:{slot}", self.base)
    }

    pub fn fence(&self) -> String {
        format!("{}fence", self.base)
    }

    pub fn wake(&self) -> String {
        format!("{}wake", self.base)
    }

    /// A SCAN pattern for the slot keys of this name.
    pub fn slot_pattern(&self) -> String {
        format!("{}*", glob_escape(&format!("{}slot:", self.base)))
    }
}

/// A SCAN pattern for the slot keys of every name under `prefix`.
pub fn all_slots_pattern(prefix: &str) -> String {
    format!("{}:{{*}}:slot:*", glob_escape(prefix))
}

/// (name, slot) of a slot key under `prefix`.
pub fn parse_slot_key<'k>(prefix: &str, key: &'k str) -> Option<(&'k str, u32)> {
    let rest = key.strip_prefix(prefix)?.strip_prefix(":{")?;
    // The name may itself contain "}:slot:"; the slot number never does.
    let (name, slot) = rest.rsplit_once("}:slot:")?;
    Some((name, slot.parse().ok()?))
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
local function token_of(value)
  local ok, record = pcall(cjson.decode, value)
  if ok and type(record) == 'table' then return record.token end
  return nil
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

-- Redis before 5 replicates scripts, not their effects, and refuses writes after TIME.
if redis.replicate_commands then redis.replicate_commands() end
"#;

/// KEYS: fence, slot 0 .. slot N-1. ARGV: holder JSON, TTL ms, first slot to try, our boot id.
/// Returns {1, slot, fence, {}} when a slot was taken, else {0, earliest PTTL
/// or -1, 0, {{slot, record}...}} with the records of holders on our boot, whose
/// processes the caller can check.
const ACQUIRE: &str = r#"
local n = #KEYS - 1
local start = tonumber(ARGV[3])
for i = 0, n - 1 do
  local slot = (start + i) % n
  local key = KEYS[slot + 2]
  if redis.call('EXISTS', key) == 0 then
    return {1, slot, take(key, KEYS[1], ARGV[1], ARGV[2]), {}}
  end
end
local earliest = -1
local ours = {}
local marker = '"boot_id":"' .. ARGV[4] .. '"'
for slot = 0, n - 1 do
  local key = KEYS[slot + 2]
  local ttl = redis.call('PTTL', key)
  if ttl >= 0 and (earliest < 0 or ttl < earliest) then earliest = ttl end
  if ARGV[4] ~= '' then
    local value = redis.call('GET', key)
    if value and string.find(value, marker, 1, true) then
      table.insert(ours, {slot, value})
    end
  end
end
return {0, earliest, 0, ours}
"#;

/// KEYS: fence, slot. ARGV: the dead holder's token, holder JSON, TTL ms.
/// Takes the slot if it is still the dead holder's (or free); returns the fence, or 0.
const TAKE_OVER: &str = r"
local value = redis.call('GET', KEYS[2])
if value and token_of(value) ~= ARGV[1] then return 0 end
return take(KEYS[2], KEYS[1], ARGV[2], ARGV[3])
";

/// KEYS: slot. ARGV: token, TTL ms. 1 when renewed; 0 when the lease is gone
/// (expired or taken over): a lapsed lease is never re-created.
const RENEW: &str = r"
local value = redis.call('GET', KEYS[1])
if value and token_of(value) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
";

/// KEYS: slot, wake list. ARGV: token, keep ms (0: free now), wake list length cap, wake list TTL ms.
/// With keep, the slot stays taken that long, marked kept so that no one reclaims
/// it for its holder's process being gone. Otherwise it is freed and one waiter woken.
/// Returns 1, or 0 when the slot was not (any longer) held with that token.
const RELEASE: &str = r#"
local value = redis.call('GET', KEYS[1])
if not value or token_of(value) ~= ARGV[1] then return 0 end
local keep = tonumber(ARGV[2])
if keep > 0 then
  redis.call('SET', KEYS[1], '{"kept":true,' .. string.sub(value, 2), 'PX', keep)
  return 1
end
redis.call('DEL', KEYS[1])
redis.call('LPUSH', KEYS[2], '1')
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[3]) - 1)
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return 1
"#;

pub struct Scripts {
    pub acquire: Script,
    pub take_over: Script,
    pub renew: Script,
    pub release: Script,
}

impl Scripts {
    pub fn new() -> Self {
        let script = |body: &str| Script::new(&format!("{PRELUDE}{body}"));
        Self {
            acquire: script(ACQUIRE),
            take_over: script(TAKE_OVER),
            renew: script(RENEW),
            release: script(RELEASE),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_the_hash_tag_and_parse_back() {
        let name = Name::parse("nightly}:slot:7 [x]").unwrap();
        let keys = Keys::new("app*", &name);
        assert_eq!(keys.fence(), "app*:{nightly}:slot:7 [x]}:fence");
        let slot = keys.slot(12);
        assert_eq!(
            parse_slot_key("app*", &slot),
            Some(("nightly}:slot:7 [x]", 12))
        );
        assert_eq!(keys.slot_pattern(), r"app\*:{nightly}:slot:7 \[x\]}:slot:*");
        assert_eq!(all_slots_pattern("a?"), r"a\?:{*}:slot:*");
        assert_eq!(parse_slot_key("other", &slot), None);
    }
}
