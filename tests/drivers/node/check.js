#!/usr/bin/env node
// node-postgres compatibility checks run through Herd's endpoint (the proxy).
//
// Usage: node check.js PROXY_URL [PRIMARY_URL]
//
// Each check prints `ok <name>` or `FAIL <name>: ...`; the process exits non-zero if any check
// failed. Every check is bounded by CHECK_TIMEOUT_MS (a watchdog exits the process, naming the
// check), and connections by connectionTimeoutMillis.
'use strict'

const assert = require('node:assert/strict')
const { pipeline } = require('node:stream/promises')
const { Readable } = require('node:stream')
const pg = require('pg')
const Cursor = require('pg-cursor')
const { from: copyFrom, to: copyTo } = require('pg-copy-streams')

const CHECK_TIMEOUT_MS = 30_000
const CONNECT_TIMEOUT_MS = 10_000
const PREFIX = 'drv_node_'
const TABLES = ['tx', 'types', 'uniq', 'copy', 'ryw', 'pipe', 'prep']

const url = process.argv[2]
const primaryUrl = process.argv[3]
if (!url) {
  console.error('usage: node check.js PROXY_URL [PRIMARY_URL]')
  process.exit(2)
}

function config(u = url, extra = {}) {
  return { connectionString: u, connectionTimeoutMillis: CONNECT_TIMEOUT_MS, ...extra }
}

// Clients of the running check, destroyed if it times out so the next check can run.
const openClients = new Set()

async function connect(u = url, extra = {}) {
  const client = new pg.Client(config(u, extra))
  // An 'error' event without a listener would crash the process with less context.
  client.on('error', (e) => console.log(`  (client error event: ${e.message})`))
  openClients.add(client)
  client.once('end', () => openClients.delete(client))
  await client.connect()
  return client
}

function destroyOpenClients() {
  for (const c of openClients) {
    try {
      c.connection.stream.destroy()
    } catch (e) {
      // already gone
    }
  }
  openClients.clear()
}

async function withClient(fn, u = url, extra = {}) {
  const client = await connect(u, extra)
  try {
    return await fn(client)
  } finally {
    await client.end().catch(() => {})
  }
}

async function one(client, text, values) {
  const r = await client.query(text, values)
  return r.rows[0]
}

async function expectError(promise, code, what) {
  try {
    await promise
  } catch (e) {
    if (e.code !== code) {
      throw new Error(`${what}: expected SQLSTATE ${code}, got ${e.code} (${e.message})`)
    }
    return e
  }
  throw new Error(`${what}: no error (expected SQLSTATE ${code})`)
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

async function withTimeout(promise, ms, what) {
  let timer
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: no answer within ${ms} ms`)), ms)
  })
  try {
    return await Promise.race([promise, timeout])
  } finally {
    clearTimeout(timer)
  }
}

// ---------------------------------------------------------------------------------------------

async function setup() {
  await withClient(async (c) => {
    for (const t of TABLES) await c.query(`drop table if exists ${PREFIX}${t}`)
    await c.query(`create table ${PREFIX}tx (id int primary key, note text)`)
    await c.query(
      `create table ${PREFIX}types (id int primary key, i bigint, t text, n numeric, ts timestamptz,
        b bytea, nul text, ia int[], ta text[], f float8, bo bool, j jsonb)`
    )
    await c.query(`create table ${PREFIX}uniq (id int primary key)`)
    await c.query(`create table ${PREFIX}copy (id int primary key, note text)`)
    await c.query(`create table ${PREFIX}ryw (id int primary key, v text)`)
    await c.query(`create table ${PREFIX}pipe (id int primary key, v text)`)
    await c.query(`create table ${PREFIX}prep (id int primary key, v text)`)
  })
}

async function checkConnect() {
  await withClient(async (c) => {
    const v = await one(c, 'show server_version_num')
    assert.match(v.server_version_num, /^15\d{4}$/, 'server_version_num')
    assert.ok(c.processID, 'BackendKeyData (processID) missing')
    assert.equal((await one(c, 'select 1 + 1 as x')).x, 2)
    assert.equal((await one(c, 'select current_user as u')).u, 'postgres')
  })
  // A wrong password is refused with 28P01.
  const u = new URL(url)
  u.password = 'not-the-password'
  const c = new pg.Client(config(u.toString()))
  c.on('error', () => {})
  await expectError(c.connect(), '28P01', 'wrong password')
  await c.end().catch(() => {})
}

async function checkTransactions() {
  const t = `${PREFIX}tx`
  const want = [
    { id: 1, note: 'committed' },
    { id: 2, note: 'committed' },
    { id: 5, note: 'outer' },
  ]
  await withClient(async (c) => {
    await c.query('begin')
    await c.query(`insert into ${t} values ($1, $2), ($3, $4)`, [1, 'committed', 2, 'committed'])
    assert.equal((await one(c, `select count(*)::int as n from ${t}`)).n, 2)
    await c.query('commit')

    await c.query('begin')
    await c.query(`insert into ${t} values (3, 'rolled back')`)
    await c.query(`update ${t} set note = 'changed' where id = 1`)
    assert.equal((await one(c, `select count(*)::int as n from ${t}`)).n, 3)
    await c.query('rollback')

    // A transaction aborted by an error, then rolled back.
    await c.query('begin')
    await c.query(`insert into ${t} values (4, 'doomed')`)
    await expectError(c.query('select 1/0'), '22012', 'division by zero in tx')
    await expectError(c.query('select 1'), '25P02', 'statement in aborted tx')
    await c.query('rollback')

    // Savepoints.
    await c.query('begin')
    await c.query(`insert into ${t} values (5, 'outer')`)
    await c.query('savepoint s1')
    await c.query(`insert into ${t} values (6, 'inner rolled back')`)
    await c.query('rollback to savepoint s1')
    await c.query('commit')

    const rows = (await c.query(`select id, note from ${t} order by id`)).rows
    assert.deepEqual(rows, want, 'rows through the proxy')
  })
  if (primaryUrl) {
    await withClient(async (p) => {
      const rows = (await p.query(`select id, note from ${t} order by id`)).rows
      assert.deepEqual(rows, want, 'rows on the primary')
    }, primaryUrl)
  }
}

async function checkParameters() {
  await withClient(async (c) => {
    // Unnamed statements (extended protocol), many times.
    for (let i = 0; i < 300; i++) {
      const r = await one(c, 'select $1::int * 2 as x, $2::text as s', [i, `v${i}`])
      assert.deepEqual(r, { x: i * 2, s: `v${i}` }, `unnamed #${i}`)
    }
    // Named prepared statements, repeated (node-postgres parses once per connection, then only
    // Binds: the proxy must keep the statement across server connections).
    for (let i = 0; i < 300; i++) {
      const r = await c.query({ name: 'q1', text: 'select $1::int + 1 as x', values: [i] })
      assert.equal(r.rows[0].x, i + 1, `named q1 #${i}`)
    }
    for (let i = 0; i < 100; i++) {
      await c.query({ name: 'ins', text: `insert into ${PREFIX}prep values ($1, $2)`, values: [i, `p${i}`] })
      const r = await c.query({ name: 'sel', text: `select v from ${PREFIX}prep where id = $1`, values: [i] })
      assert.deepEqual(r.rows, [{ v: `p${i}` }], `named read-your-write #${i}`)
    }
    // Named statements inside transactions.
    for (let i = 0; i < 20; i++) {
      await c.query('begin')
      const r = await c.query({ name: 'q1', text: 'select $1::int + 1 as x', values: [i] })
      assert.equal(r.rows[0].x, i + 1)
      await c.query('commit')
    }
    // Many distinct named statements.
    for (let i = 0; i < 50; i++) {
      const r = await c.query({ name: `d${i}`, text: `select $1::int + ${i} as x`, values: [1] })
      assert.equal(r.rows[0].x, 1 + i)
    }
    // Types.
    const ts = new Date('2024-02-29T13:14:15.123Z')
    const bytes = Buffer.from([0, 1, 255, 98, 105, 110, 0])
    const text = 'héllo wörld ☃ \'quote\' "dq" \\ backslash'
    const vals = [2 ** 40, text, '12345678901234567890.123456789', ts, bytes, null, [1, 2, null, 4], ['a', 'b c', null, 'd"e'], 3.5, true, { k: [1, 'x'] }]
    const r = await one(
      c,
      `select $1::bigint as i, $2::text as t, $3::numeric as n, $4::timestamptz as ts, $5::bytea as b,
        $6::text as nul, $7::int[] as ia, $8::text[] as ta, $9::float8 as f, $10::bool as bo, $11::jsonb as j`,
      vals
    )
    const want = { i: String(2 ** 40), t: text, n: '12345678901234567890.123456789', ts, b: bytes, nul: null, ia: [1, 2, null, 4], ta: ['a', 'b c', null, 'd"e'], f: 3.5, bo: true, j: { k: [1, 'x'] } }
    assert.deepEqual(r, want, 'parameter round trip')
    await c.query(`insert into ${PREFIX}types values (1, $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`, vals)
    const back = await one(c, `select i, t, n, ts, b, nul, ia, ta, f, bo, j from ${PREFIX}types where id = 1`)
    assert.deepEqual(back, want, 'table round trip')
    // Binary results.
    const bin = await c.query({ text: 'select $1::int4 as x, $2::text as s', values: [7, 'b'], binary: true })
    assert.equal(bin.rows[0].s, 'b')
    // rowMode array and field metadata.
    const arr = await c.query({ text: 'select 1 as a, 2 as b', rowMode: 'array' })
    assert.deepEqual(arr.rows, [[1, 2]])
    assert.deepEqual(arr.fields.map((f) => f.name), ['a', 'b'])
    // Multiple statements in one simple query.
    const multi = await c.query('select 1 as a; select 2 as b')
    assert.equal(multi.length, 2)
    assert.equal(multi[1].rows[0].b, 2)
  })
}

async function checkErrors() {
  await withClient(async (c) => {
    await c.query(`insert into ${PREFIX}uniq values (1)`)
    const e = await expectError(c.query(`insert into ${PREFIX}uniq values ($1)`, [1]), '23505', 'unique violation')
    assert.equal(e.constraint, `${PREFIX}uniq_pkey`)
    assert.equal(e.table, `${PREFIX}uniq`)
    assert.match(e.detail, /Key \(id\)=\(1\) already exists/)
    assert.equal((await one(c, 'select 1 as x')).x, 1)
    await expectError(c.query('select 1/0'), '22012', 'division by zero')
    await expectError(c.query('select $1::int / $2::int', [1, 0]), '22012', 'parameterised division by zero')
    await expectError(c.query({ name: 'div', text: 'select $1::int / $2::int', values: [1, 0] }), '22012', 'named division by zero')
    assert.equal((await c.query({ name: 'div', text: 'select $1::int / $2::int', values: [4, 2] })).rows[0]['?column?'], 2)
    await expectError(c.query('select * from no_such_table_xyz'), '42P01', 'undefined table')
    await expectError(c.query('selec 1'), '42601', 'syntax error')
    await expectError(c.query('select $1::int', ['abc']), '22P02', 'invalid text representation')
    const custom = await expectError(
      c.query("do $$ begin raise exception 'custom failure' using errcode = 'P0099', detail = 'the detail', hint = 'the hint'; end $$"),
      'P0099',
      'custom raise'
    )
    assert.equal(custom.detail, 'the detail')
    assert.equal(custom.hint, 'the hint')
    const notices = []
    c.on('notice', (n) => notices.push(n.message))
    await c.query("do $$ begin raise notice 'hello notice'; end $$")
    await sleep(50)
    assert.deepEqual(notices, ['hello notice'])
    await c.query('begin read only')
    await expectError(c.query(`insert into ${PREFIX}uniq values (3)`), '25006', 'write in read-only tx')
    await c.query('rollback')
    assert.equal((await one(c, 'select 3 as x')).x, 3)
  })
}

async function checkCopy() {
  const t = `${PREFIX}copy`
  const n = 20000
  await withClient(async (c) => {
    const lines = []
    for (let i = 0; i < n; i++) lines.push(`${i}\trow ${i}\n`)
    await pipeline(Readable.from(lines), c.query(copyFrom(`COPY ${t} (id, note) FROM STDIN`)))
    const r = await one(c, `select count(*)::int as n, sum(id)::bigint as s from ${t}`)
    assert.deepEqual(r, { n, s: String((n * (n - 1)) / 2) }, 'rows after COPY FROM')
    // COPY TO STDOUT.
    let out = ''
    const stream = c.query(copyTo(`COPY (select id, note from ${t} order by id) TO STDOUT`))
    stream.setEncoding('utf8')
    for await (const chunk of stream) out += chunk
    const got = out.split('\n').filter((l) => l)
    assert.equal(got.length, n, 'rows from COPY TO')
    assert.equal(got[n - 1], `${n - 1}\trow ${n - 1}`)
    // A failing COPY FROM (duplicate key): 23505, connection usable.
    let err
    try {
      await pipeline(Readable.from(['1\tdup\n', '2\tdup\n']), c.query(copyFrom(`COPY ${t} (id, note) FROM STDIN`)))
    } catch (e) {
      err = e
    }
    assert.ok(err, 'duplicate COPY did not fail')
    assert.equal(err.code, '23505', `duplicate COPY: ${err.message}`)
    assert.equal((await one(c, `select count(*)::int as n from ${t}`)).n, n)
  })
}

async function checkCancel() {
  await withClient(async (c) => {
    for (let attempt = 0; attempt < 2; attempt++) {
      const q = new pg.Query('select pg_sleep(10)')
      const done = new Promise((resolve) => {
        q.on('error', (e) => resolve(e))
        q.on('end', () => resolve(null))
      })
      const start = Date.now()
      c.query(q)
      await sleep(500)
      // node-postgres's cancel: a new Client opens a connection and sends CancelRequest with the
      // key from `c`'s BackendKeyData.
      new pg.Client(config()).cancel(c, q)
      const e = await Promise.race([done, sleep(8000).then(() => 'timeout')])
      if (e === 'timeout') throw new Error(`pg_sleep(10) not cancelled within 8s (attempt ${attempt})`)
      if (!e) throw new Error(`pg_sleep(10) completed instead of being cancelled (attempt ${attempt})`)
      assert.equal(e.code, '57014', `cancel: ${e.message}`)
      const took = Date.now() - start
      assert.ok(took < 5000, `cancel took ${took} ms`)
      assert.equal((await one(c, 'select 5 as x')).x, 5)
    }
  })
}

async function checkLargeResult() {
  const n = 200000
  const q = `select g, repeat('x', 100) as s from generate_series(1, ${n}) g`
  await withClient(async (c) => {
    const r = await c.query(q)
    assert.equal(r.rows.length, n, 'rows')
    assert.equal(r.rowCount, n, 'rowCount')
    let sum = 0
    for (const row of r.rows) sum += row.g
    assert.equal(sum, (n * (n + 1)) / 2, 'sum')
    assert.equal(r.rows[n - 1].s, 'x'.repeat(100))
    assert.equal((await one(c, 'select 9 as x')).x, 9)
  })
}

// pg-cursor reads a portal in chunks: Execute with a row limit, answered by PortalSuspended,
// then Flush (no Sync) between chunks; Close + Sync at the end.
async function checkCursor() {
  const n = 200000
  const q = `select g, repeat('x', 100) as s from generate_series(1, ${n}) g`
  await withClient(async (c) => {
    let count
    let sum
    // pg-cursor: Execute with a row limit (PortalSuspended) and Flush, outside a transaction.
    const cursor = c.query(new Cursor(q))
    count = 0
    sum = 0
    for (;;) {
      const rows = await withTimeout(cursor.read(5000), 10000, `pg-cursor read(5000) after ${count} rows`)
      if (rows.length === 0) break
      count += rows.length
      for (const row of rows) sum += row.g
    }
    await cursor.close()
    assert.equal(count, n, 'rows through pg-cursor')
    assert.equal(sum, (n * (n + 1)) / 2, 'sum through pg-cursor')
    // The same inside a transaction.
    await c.query('begin')
    const cur2 = c.query(new Cursor(q))
    count = 0
    for (;;) {
      const rows = await withTimeout(cur2.read(20000), 10000, `pg-cursor read(20000) in a transaction after ${count} rows`)
      if (rows.length === 0) break
      count += rows.length
    }
    await cur2.close()
    await c.query('commit')
    assert.equal(count, n, 'rows through pg-cursor in a transaction')
    // In a READ ONLY transaction (which the proxy may place on a replica).
    await c.query('begin read only')
    const cur3 = c.query(new Cursor(q))
    count = 0
    for (;;) {
      const rows = await withTimeout(cur3.read(1000), 10000, `pg-cursor read(1000) in a READ ONLY transaction after ${count} rows`)
      if (rows.length === 0) break
      count += rows.length
    }
    await cur3.close()
    await c.query('commit')
    assert.equal(count, n, 'rows through pg-cursor in a READ ONLY transaction')
    assert.equal((await one(c, 'select 10 as x')).x, 10)
  })
}

async function checkReadYourWrites() {
  const t = `${PREFIX}ryw`
  await withClient(async (c) => {
    const missing = []
    for (let i = 0; i < 200; i++) {
      await c.query(`insert into ${t} values ($1, $2)`, [i, `v${i}`])
      const r = await c.query(`select v from ${t} where id = $1`, [i])
      if (r.rows.length !== 1 || r.rows[0].v !== `v${i}`) missing.push([i, r.rows])
      if (i % 10 === 0) {
        const s = await one(c, `select count(*)::int as n from ${t}`) // simple protocol
        if (s.n !== i + 1) missing.push([i, `count ${s.n}`])
      }
    }
    if (missing.length) {
      throw new Error(`${missing.length} of 200 reads missed the row just written, e.g. ${JSON.stringify(missing.slice(0, 5))}`)
    }
    for (let i = 0; i < 50; i++) {
      await c.query(`update ${t} set v = $1 where id = $2`, [`u${i}`, i])
      assert.deepEqual((await c.query(`select v from ${t} where id = $1`, [i])).rows, [{ v: `u${i}` }], `after update #${i}`)
      await c.query(`delete from ${t} where id = $1`, [i])
      assert.deepEqual((await c.query(`select v from ${t} where id = $1`, [i])).rows, [], `after delete #${i}`)
    }
  })
}

async function checkPipeline() {
  const t = `${PREFIX}pipe`
  await withClient(
    async (c) => {
      const ps = []
      for (let i = 0; i < 10; i++) ps.push(c.query(`insert into ${t} values ($1, $2)`, [i, `p${i}`]))
      ps.push(c.query(`select count(*)::int as n from ${t}`))
      ps.push(c.query({ name: 'pq', text: `select v from ${t} where id = $1`, values: [9] }))
      const rs = await Promise.all(ps)
      assert.equal(rs[10].rows[0].n, 10, 'count in pipeline')
      assert.deepEqual(rs[11].rows, [{ v: 'p9' }], 'read-your-write in pipeline')
      // An error in the middle: only that query fails.
      const results = await Promise.allSettled([
        c.query('select 1 as x'),
        c.query('select 1/0'),
        c.query('select 2 as x'),
      ])
      assert.equal(results[0].status, 'fulfilled')
      assert.equal(results[1].status, 'rejected')
      assert.equal(results[1].reason.code, '22012')
      assert.equal(results[2].status, 'fulfilled', `query after a pipelined error: ${results[2].reason}`)
      assert.equal(results[2].value.rows[0].x, 2)
      const many = await Promise.all(Array.from({ length: 100 }, (_, i) => c.query({ name: 'pm', text: 'select $1::int * 10 as x', values: [i] })))
      many.forEach((r, i) => assert.equal(r.rows[0].x, i * 10))
    },
    url,
    { pipeline: true }
  )
}

async function cleanup() {
  await withClient(async (c) => {
    for (const t of TABLES) await c.query(`drop table if exists ${PREFIX}${t}`)
  })
}

// ---------------------------------------------------------------------------------------------

async function main() {
  console.log(`node ${process.version}, pg ${require('pg/package.json').version}`)
  const checks = [
    ['setup', setup],
    ['connect', checkConnect],
    ['transactions', checkTransactions],
    ['parameters', checkParameters],
    ['errors', checkErrors],
    ['copy', checkCopy],
    ['cancel', checkCancel],
    ['large_result', checkLargeResult],
    ['read_your_writes', checkReadYourWrites],
    ['pipeline', checkPipeline],
    ['cursor', checkCursor],
    ['cleanup', cleanup],
  ]
  const failures = []
  for (const [name, fn] of checks) {
    const start = Date.now()
    let timer
    const watchdog = new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(`timed out after ${CHECK_TIMEOUT_MS} ms`)), CHECK_TIMEOUT_MS)
    })
    try {
      await Promise.race([fn(), watchdog])
      console.log(`ok ${name} (${((Date.now() - start) / 1000).toFixed(2)}s)`)
    } catch (e) {
      failures.push(name)
      console.log(`FAIL ${name}: ${e.code ? `[${e.code}] ` : ''}${e.stack || e}`)
      // A hung check's connections are dropped so the next checks start clean.
      destroyOpenClients()
      if (name === 'setup') break
    } finally {
      clearTimeout(timer)
    }
  }
  if (failures.length) {
    console.log(`FAILED: ${failures.join(', ')}`)
    process.exit(1)
  }
  console.log('all node-postgres checks passed')
  process.exit(0)
}

main().catch((e) => {
  console.log(`FAIL: ${e.stack || e}`)
  process.exit(1)
})
