"""The one Lua script of the shared limiter (kept as a string so it ships with the package)."""

from __future__ import annotations

SCOPE_KEYS = 4  # keys per scope: RPM TAT, TPM TAT, lease ZSET, mean hold time

GCRA_LUA = r"""
-- kvgate limiter, one atomic step per call (Redis server time, never client time).
--
-- mode "acquire" / "release":
--   KEYS[1] tombstone of this lease id; then per scope i (0-based) KEYS[2+4i ..]: RPM TAT,
--   TPM TAT, lease ZSET (score = expiry ms), mean lease hold time (ms)
--   acquire ARGV: mode, lease id, lease ttl ms, tokens, slots, n, then per scope:
--                 rpm, tpm, max_concurrency (0 = unlimited), rpm hint ms, tpm hint ms
--   release ARGV: mode, lease id, used tokens, reserved tokens, held ms, uncertain (0|1),
--                 lease ttl ms, slots, n, then per scope: rpm, tpm, max_concurrency
-- mode "renew":  KEYS = lease ZSETs; ARGV: mode, ttl ms, then (key index, lease id, slots)
-- mode "charge": KEYS = per scope its RPM TAT; ARGV: mode, then per scope its rpm. One request
--                from every scope (a refused request's cost), or from none when one has no
--                room; replies as acquire does, with "rpm_remaining rpm_reset_ms" per scope
--
-- A lease of s slots is s members of each lease ZSET: the lease id, then "id:1" .. "id:s-1",
-- all with the same expiry; so ZCARD is the slots held, and expiry, renewal and release treat
-- the members together. s above a scope's max_concurrency is never admissible (reason 5).
-- mode "beat":   KEYS[1] replica ZSET; ARGV: mode, replica id, window ms -> live replicas
-- mode "extend": KEYS as acquire; ARGV: mode, lease id, tokens, n, then per scope: rpm, tpm.
--                More TPM for a lease still held (a later step of a gateway tool loop): taken
--                from every scope or from none; no request and no slot is taken. The caller's
--                lease now reserves ``tokens`` more, and release reconciles against the sum.
--                Replies as acquire does; reason 3 when the lease is no longer held (expired
--                or released), 4 when ``tokens`` alone exceed a scope's TPM.
--
-- GCRA per dimension with limit L over PERIOD: emission interval T = PERIOD / L, tolerance
-- PERIOD (burst = L). TAT = theoretical arrival time; a cost c is admitted iff
-- max(TAT, now) + c*T - now <= PERIOD. A TAT is stored with the limit it was computed for
-- ("tat limit"); read under another limit, the debt (TAT - now) is rescaled so that the same
-- number of requests / tokens stays used: raising a limit frees room at once.
-- A hint (ms of debt a replica saw while Redis was away) seeds a TAT that Redis lost; the
-- seeded TAT is stored even when the request is rejected, so every replica sees it.
--
-- Every scope records every admitted lease (its ZSET), so release knows, per scope, whether
-- there is a reservation to reconcile: releasing twice, or a lease never admitted, takes
-- nothing. A lease released while its admission is in doubt leaves a tombstone that refuses a
-- late admission of the same id (the caller gave up on that call).
--
-- acquire returns "allowed reason scope retry_ms" then per scope "rpm_remaining rpm_reset_ms
-- tpm_remaining tpm_reset_ms" (integers in one string: one bulk reply reads faster than an
-- array); reason 0 ok, 1 requests, 2 tokens, 3 concurrency, 4 too large, 5 too wide; scope is
-- the 1-based rejecting scope, 0 when admitted. Never admissible (4, 5) wins over the rest: the
-- first scope that is so is named.
local PERIOD = 60000.0
-- A debt within SLACK ms of PERIOD counts as within it: float rounding of TATs (stored to 1 us,
-- summed on epoch milliseconds) must not refuse the last request a limit allows.
local SLACK = 0.01
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000.0 + math.floor(tonumber(t[2]) / 1000)
local mode = ARGV[1]

local function members(id, slots)
  local m = {id}
  for j = 1, slots - 1 do m[#m + 1] = id .. ':' .. j end
  return m
end

local function add_members(key, score, id, slots, flag)
  local args = {}
  if flag then args[1] = flag end
  for _, m in ipairs(members(id, slots)) do
    args[#args + 1] = score
    args[#args + 1] = m
  end
  redis.call('ZADD', key, unpack(args))
end

if mode == 'beat' then
  redis.call('ZADD', KEYS[1], now, ARGV[2])
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[3]))
  redis.call('PEXPIRE', KEYS[1], math.ceil(tonumber(ARGV[3])) * 2)
  return redis.call('ZCARD', KEYS[1])
end

if mode == 'renew' then
  local ttl = tonumber(ARGV[2])
  for i = 3, #ARGV, 3 do
    add_members(KEYS[tonumber(ARGV[i])], now + ttl, ARGV[i + 1], tonumber(ARGV[i + 2]), 'XX')
  end
  for i = 1, #KEYS do redis.call('PEXPIRE', KEYS[i], math.ceil(ttl) + 1000) end
  return 1
end

local seeded = {}  -- key -> true when its TAT came from a hint

local function load_tat(key, limit, hint)
  local v = redis.call('GET', key)
  if not v then
    if hint > 0 then
      seeded[key] = true
      return now + hint
    end
    return now
  end
  local tat, old = string.match(v, '^(%S+) (%S+)$')
  if tat then tat, old = tonumber(tat), tonumber(old) else tat, old = tonumber(v), limit end
  if tat > now and old ~= limit then tat = now + (tat - now) * old / limit end
  return math.max(tat, now)
end

local function store_tat(key, tat, limit)
  if tat <= now then
    redis.call('DEL', key)
  else
    redis.call('SET', key, string.format('%.3f %d', tat, limit), 'PX', math.ceil(tat - now) + 1000)
  end
end

local function remaining(limit, tat)
  if limit <= 0 then return -1 end
  return math.floor((PERIOD + SLACK - (tat - now)) / (PERIOD / limit))
end

if mode == 'charge' then
  local reason, at, retry, tats, news = 0, 0, 0, {}, {}
  for i = 1, #KEYS do
    local rpm = tonumber(ARGV[1 + i])
    tats[i], news[i] = now, now
    if rpm > 0 then
      tats[i] = load_tat(KEYS[i], rpm, 0)
      news[i] = tats[i] + PERIOD / rpm
      if reason == 0 and news[i] - now > PERIOD + SLACK then
        reason, at, retry = 1, i, news[i] - now - PERIOD
      end
    end
  end
  local out = {}
  for i = 1, #KEYS do
    local rpm = tonumber(ARGV[1 + i])
    if reason ~= 0 then news[i] = tats[i] elseif rpm > 0 then store_tat(KEYS[i], news[i], rpm) end
    out[#out + 1] = string.format('%d %d', remaining(rpm, news[i]), math.ceil(news[i] - now))
  end
  return string.format('%d %d %d %d ', reason == 0 and 1 or 0, reason, at, math.ceil(retry))
    .. table.concat(out, ' ')
end

local id = ARGV[2]

if mode == 'release' then
  local used, reserved, held = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
  local slots, n = tonumber(ARGV[8]), tonumber(ARGV[9])
  for i = 0, n - 1 do
    local k, a = 2 + 4 * i, 10 + 3 * i
    local tpm, conc = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
    local removed = math.min(1, redis.call('ZREM', KEYS[k + 2], unpack(members(id, slots))))
    if i == 0 and removed == 0 and ARGV[6] == '1' then
      redis.call('SET', KEYS[1], '1', 'PX', math.ceil(tonumber(ARGV[7])) + 1000)
    end
    if removed == 1 and tpm > 0 then
      local tat = load_tat(KEYS[k + 1], tpm, 0)
      local delta = (used - reserved) * (PERIOD / tpm)
      if tat > now then store_tat(KEYS[k + 1], math.max(tat + delta, now), tpm) end
    end
    if removed == 1 and conc > 0 and held > 0 then
      local mean = tonumber(redis.call('GET', KEYS[k + 3]) or held)
      redis.call('SET', KEYS[k + 3], string.format('%d', 0.8 * mean + 0.2 * held), 'PX', 600000)
    end
  end
  return 1
end

if mode == 'extend' then
  local tokens, n = tonumber(ARGV[3]), tonumber(ARGV[4])
  local reason, at, retry = 0, 0, 0
  local held = redis.call('ZSCORE', KEYS[4], id)
  if not held or tonumber(held) <= now then reason, at = 3, 1 end
  local rpm_tat, tpm_tat, tpm_new = {}, {}, {}
  for i = 0, n - 1 do
    local k, a = 2 + 4 * i, 5 + 2 * i
    local rpm, tpm = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
    rpm_tat[i], tpm_tat[i], tpm_new[i] = now, now, now
    if rpm > 0 then rpm_tat[i] = load_tat(KEYS[k], rpm, 0) end
    if tpm > 0 then
      tpm_tat[i] = load_tat(KEYS[k + 1], tpm, 0)
      tpm_new[i] = tpm_tat[i] + tokens * (PERIOD / tpm)
      if tokens > tpm and reason < 4 then reason, at, retry = 4, i + 1, -1
      elseif reason == 0 and tpm_new[i] - now > PERIOD + SLACK then
        reason, at, retry = 2, i + 1, tpm_new[i] - now - PERIOD
      end
    end
  end
  local out = {}
  for i = 0, n - 1 do
    local a = 5 + 2 * i
    local rpm, tpm = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
    if reason == 0 and tpm > 0 then
      store_tat(KEYS[3 + 4 * i], tpm_new[i], tpm)
    else
      tpm_new[i] = tpm_tat[i]
    end
    out[#out + 1] = string.format('%d %d %d %d', remaining(rpm, rpm_tat[i]),
      math.ceil(rpm_tat[i] - now), remaining(tpm, tpm_new[i]), math.ceil(tpm_new[i] - now))
  end
  return string.format('%d %d %d %d ', reason == 0 and 1 or 0, reason, at, math.ceil(retry))
    .. table.concat(out, ' ')
end

-- acquire
local ttl, tokens = tonumber(ARGV[3]), tonumber(ARGV[4])
local slots, n = tonumber(ARGV[5]), tonumber(ARGV[6])
local gone = redis.call('EXISTS', KEYS[1]) == 1
local again = n > 0 and redis.call('ZSCORE', KEYS[4], id) ~= false
local reason, at, retry = 0, 0, 0
if gone then reason, at = 3, 1 end  -- released while in doubt: never admit it now
local rpm_tat, tpm_tat, rpm_new, tpm_new = {}, {}, {}, {}
for i = 0, n - 1 do
  local k, a = 2 + 4 * i, 7 + 5 * i
  local rpm, tpm, conc = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  rpm_tat[i], tpm_tat[i], rpm_new[i], tpm_new[i] = now, now, now, now
  if rpm > 0 then
    rpm_tat[i] = load_tat(KEYS[k], rpm, tonumber(ARGV[a + 3]))
    rpm_new[i] = rpm_tat[i] + PERIOD / rpm
    if reason == 0 and not again and rpm_new[i] - now > PERIOD + SLACK then
      reason, at, retry = 1, i + 1, rpm_new[i] - now - PERIOD
    end
  end
  if tpm > 0 then
    tpm_tat[i] = load_tat(KEYS[k + 1], tpm, tonumber(ARGV[a + 4]))
    tpm_new[i] = tpm_tat[i] + tokens * (PERIOD / tpm)
    if tokens > tpm and not again and reason < 4 then reason, at, retry = 4, i + 1, -1
    elseif reason == 0 and not again and tpm_new[i] - now > PERIOD + SLACK then
      reason, at, retry = 2, i + 1, tpm_new[i] - now - PERIOD
    end
  end
  if conc > 0 and slots > conc and not again and reason < 4 then
    reason, at, retry = 5, i + 1, -1
  end
end
if reason == 0 and not again then
  for i = 0, n - 1 do
    local k, conc = 2 + 4 * i, tonumber(ARGV[9 + 5 * i])
    if reason == 0 and conc > 0 then
      redis.call('ZREMRANGEBYSCORE', KEYS[k + 2], '-inf', now)
      if redis.call('ZCARD', KEYS[k + 2]) + slots > conc then
        local first = redis.call('ZRANGE', KEYS[k + 2], 0, 0, 'WITHSCORES')
        retry = tonumber(first[2]) - now
        local mean = redis.call('GET', KEYS[k + 3])
        if mean then retry = math.min(retry, tonumber(mean)) end
        reason, at = 3, i + 1
      end
    end
  end
end

local admit = reason == 0 and not again
local out = {}
for i = 0, n - 1 do
  local k, a = 2 + 4 * i, 7 + 5 * i
  local rpm, tpm = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  if admit then
    if rpm > 0 then store_tat(KEYS[k], rpm_new[i], rpm) end
    if tpm > 0 then store_tat(KEYS[k + 1], tpm_new[i], tpm) end
    add_members(KEYS[k + 2], now + ttl, id, slots, nil)
    redis.call('PEXPIRE', KEYS[k + 2], math.ceil(ttl) + 1000)
  else
    rpm_new[i], tpm_new[i] = rpm_tat[i], tpm_tat[i]
    if seeded[KEYS[k]] then store_tat(KEYS[k], rpm_tat[i], rpm) end
    if seeded[KEYS[k + 1]] then store_tat(KEYS[k + 1], tpm_tat[i], tpm) end
  end
  out[#out + 1] = string.format('%d %d %d %d', remaining(rpm, rpm_new[i]),
    math.ceil(rpm_new[i] - now), remaining(tpm, tpm_new[i]), math.ceil(tpm_new[i] - now))
end
return string.format('%d %d %d %d ', reason == 0 and 1 or 0, reason, at, math.ceil(retry))
  .. table.concat(out, ' ')
"""
