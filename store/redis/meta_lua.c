/*
 * Redis metadata: the Lua scripts (store/redis/meta_internal.h).
 */
#include "store/redis/meta_internal.h"

/*
 * The read check, run by exists_batch, lookup_batch and the re-sync sweep.
 * A record lists every node holding a copy in its fields "h:{node}" (value:
 * that node's epoch when it wrote; replicas, docs/redis-schema.md); a
 * record written before holders were listed has only "node" and "epoch",
 * which then name its one holder.  For each record: missing -> 0; each
 * holder whose registry entry is missing or carries another epoch is
 * dropped (its "h:" field deleted); none left live -> the record is
 * deleted, -1; else live: 1 (mode "e"), the record's ten fields followed
 * by node, epoch of every live holder (mode "l"), or 1 when the caller's
 * node ARGV[3] is a live holder and 2 when only others are (mode "s").  A
 * key of another type (someone else's garbage) counts as missing, so that
 * it cannot fail the whole batch.
 * Registry epochs are cached per node for the duration of one call.
 * Mode "e" first tries the common case in two cheap calls: the last
 * writer ("node") is live and still a holder; only otherwise is the whole
 * record read.  exists_batch no longer uses it: it asks for the record
 * ("l") and parses its fields as lookup does, so a forged or junk record
 * does not read as present (issue 23 N8).
 */
const char ecs__meta_check_lua[] =
    "local pfx, mode, me = ARGV[1], ARGV[2], ARGV[3]\n"
    "local cache, out = {}, {}\n"
    "local names = {'node', 'epoch', 'off', 'len', 'raw_len', 'dtype', 'shape', 'csum', 'codec', 't'}\n"
    "local byte, sub = string.byte, string.sub\n"
    "local function regepoch(id)\n"
    "  local ne = cache[id]\n"
    "  if ne == nil then\n"
    "    ne = redis.call('HGET', pfx .. id, 'epoch')\n"
    "    cache[id] = ne\n"
    "  end\n"
    "  return ne\n"
    "end\n"
    "local function check(k)\n"
    "  if mode == 'e' then\n"
    "    local q = redis.pcall('HMGET', k, 'node', 'epoch')\n"
    "    if not q.err and q[1] and q[2] and regepoch(q[1]) == q[2] and\n"
    "       redis.call('HEXISTS', k, 'h:' .. q[1]) == 1 then\n"
    "      return 1\n"
    "    end\n"
    "  end\n"
    "  local r = redis.pcall('HGETALL', k)\n"
    "  if r.err or #r == 0 then return 0 end\n"
    "  local f, live, nh, mine = {}, {}, 0, false\n"
    "  for j = 1, #r, 2 do\n"
    "    local name, v = r[j], r[j + 1]\n"
    "    if byte(name, 1) == 104 and byte(name, 2) == 58 then\n"
    "      nh = nh + 1\n"
    "      local id = sub(name, 3)\n"
    "      if regepoch(id) == v then\n"
    "        live[#live + 1] = id\n"
    "        live[#live + 1] = v\n"
    "        if id == me then mine = true end\n"
    "      else\n"
    "        redis.call('HDEL', k, name)\n"
    "      end\n"
    "    else\n"
    "      f[name] = v\n"
    "    end\n"
    "  end\n"
    "  if nh == 0 then\n"
    "    if not f.node and not f.epoch then return 0 end\n"
    "    if f.node and f.epoch and regepoch(f.node) == f.epoch then\n"
    "      live[1] = f.node\n"
    "      live[2] = f.epoch\n"
    "      mine = f.node == me\n"
    "    end\n"
    "  end\n"
    "  if #live == 0 then\n"
    "    redis.call('DEL', k)\n"
    "    return -1\n"
    "  end\n"
    "  if mode == 'l' then\n"
    "    local res = {}\n"
    "    for j, n in ipairs(names) do res[j] = f[n] or false end\n"
    "    for j = 1, #live do res[10 + j] = live[j] end\n"
    "    return res\n"
    "  elseif mode == 's' then\n"
    "    if mine then return 1 end\n"
    "    return 2\n"
    "  end\n"
    "  return 1\n"
    "end\n"
    "for i = 1, #KEYS do out[i] = check(KEYS[i]) end\n"
    "return out\n";

/* Record deletes on behalf of one holder, for every key of KEYS (a flush's
 * worth of evictions goes in one call; a namespace's keys share the {ns}
 * hash tag, so they are one Redis Cluster slot).  Per key: drops its "h:"
 * field, and the whole record only when no other holder is listed (a
 * record without holder fields, written before replicas, goes only if
 * "node" still names this node).  Another node may hold a copy, or have
 * published the same content key since: its entry must stay.  A key of
 * another type (someone else's garbage) is left alone, as the check
 * script leaves it, so that it cannot fail the keys after it.  Returns
 * the number of records deleted. */
const char ecs__meta_del_lua[] =
    "local n, me = 0, 'h:' .. ARGV[1]\n"
    "for _, k in ipairs(KEYS) do\n"
    "  local had = redis.pcall('HDEL', k, me)\n"
    "  if type(had) == 'number' then\n"
    "    local other = false\n"
    "    for _, f in ipairs(redis.call('HKEYS', k)) do\n"
    "      if string.sub(f, 1, 2) == 'h:' then\n"
    "        other = true\n"
    "        break\n"
    "      end\n"
    "    end\n"
    "    if not other and (had == 1 or redis.call('HGET', k, 'node') == ARGV[1]) then\n"
    "      n = n + redis.call('DEL', k)\n"
    "    end\n"
    "  end\n"
    "end\n"
    "return n\n";

const size_t ecs__meta_check_lua_len = sizeof ecs__meta_check_lua - 1;
const size_t ecs__meta_del_lua_len = sizeof ecs__meta_del_lua - 1;
