"""The one Lua script of the shared limiter (kept as a string so it ships with the package)."""

from __future__ import annotations

GCRA_LUA = r"""
-- kvgate admission and release, one atomic step per call (Redis server time, never client time).
--
-- KEYS[1] RPM TAT   KEYS[2] TPM TAT   KEYS[3] lease ZSET (member = lease id, score = expiry ms)
-- ARGV[1] mode "acquire" | "release"
-- ARGV[2] rpm   ARGV[3] tpm   ARGV[4] max_concurrency      (0 = unlimited)
-- ARGV[5] tokens (acquire: reserved; release: reserved)   ARGV[6] lease id
-- ARGV[7] lease ttl ms (acquire)  |  used tokens (release)
--
-- GCRA per dimension with limit L over PERIOD: emission interval T = PERIOD / L, tolerance
-- PERIOD (burst = L). TAT = theoretical arrival time; a cost c is admitted iff
-- max(TAT, now) + c*T - now <= PERIOD. Nothing is written unless every dimension admits.
--
-- acquire returns "allowed reason rpm_remaining rpm_reset_ms tpm_remaining tpm_reset_ms
-- retry_after_ms" (seven integers in one string: one bulk reply reads faster than an array);
-- reason 0 ok, 1 requests, 2 tokens, 3 concurrency, 4 too large.
local PERIOD = 60000.0
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000.0 + math.floor(tonumber(t[2]) / 1000)

local function load_tat(key)
  local v = redis.call('GET', key)
  if v then return math.max(tonumber(v), now) end
  return now
end

local function store_tat(key, tat)
  if tat <= now then
    redis.call('DEL', key)
  else
    redis.call('SET', key, string.format('%.3f', tat), 'PX', math.ceil(tat - now) + 1000)
  end
end

local rpm, tpm, conc = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local tokens = tonumber(ARGV[5])

if ARGV[1] == 'release' then
  redis.call('ZREM', KEYS[3], ARGV[6])
  if tpm > 0 then
    local used = tonumber(ARGV[7])
    local v = redis.call('GET', KEYS[2])
    if v then store_tat(KEYS[2], math.max(tonumber(v) + (used - tokens) * (PERIOD / tpm), now)) end
  end
  return 1
end

local reason, retry = 0, 0
local rpm_tat, rpm_new, tpm_tat, tpm_new = now, now, now, now
if rpm > 0 then
  rpm_tat = load_tat(KEYS[1])
  rpm_new = rpm_tat + PERIOD / rpm
  if rpm_new - now > PERIOD then reason, retry = 1, rpm_new - now - PERIOD end
end
if tpm > 0 then
  tpm_tat = load_tat(KEYS[2])
  tpm_new = tpm_tat + tokens * (PERIOD / tpm)
  if tokens > tpm then reason, retry = 4, -1
  elseif reason == 0 and tpm_new - now > PERIOD then reason, retry = 2, tpm_new - now - PERIOD end
end
if reason == 0 and conc > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  if redis.call('ZCARD', KEYS[3]) >= conc then
    reason = 3
    local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
    retry = math.min(tonumber(first[2]) - now, 1000)
  end
end

if reason == 0 then
  if rpm > 0 then store_tat(KEYS[1], rpm_new) end
  if tpm > 0 then store_tat(KEYS[2], tpm_new) end
  if conc > 0 then
    local ttl = tonumber(ARGV[7])
    redis.call('ZADD', KEYS[3], now + ttl, ARGV[6])
    redis.call('PEXPIRE', KEYS[3], math.ceil(ttl) + 1000)
  end
else
  rpm_new, tpm_new = rpm_tat, tpm_tat
end

local function remaining(limit, tat)
  if limit <= 0 then return -1 end
  return math.floor((PERIOD - (tat - now)) / (PERIOD / limit))
end
return string.format('%d %d %d %d %d %d %d', reason == 0 and 1 or 0, reason,
                     remaining(rpm, rpm_new), math.ceil(rpm_new - now),
                     remaining(tpm, tpm_new), math.ceil(tpm_new - now), math.ceil(retry))
"""
