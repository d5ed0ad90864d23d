"""Statements that are reads and statements that are not, for every dialect PAW speaks:
the corpus of the parser's rule of a read (``paw_sqlcheck``).

``READS`` are what a data agent writes every day (aggregates, windows, CTEs, JSON, dates,
casts, literal forms); they must be judged reads and must run on the real databases in
read-only mode. ``ATTACKS`` are writes and side effects dressed as reads: the statements
issue 25 found running on a read-only datasource, and the bypass forms of each dialect
(comments in every position, nested and dollar-quoted strings, Unicode escapes, case,
schema-qualified and quoted function names, commands). None may be judged a read, in any
dialect.
"""

from __future__ import annotations

#: Reads on every dialect (standard SQL that PostgreSQL, MariaDB and SQLite all run).
COMMON_READS = [
    "SELECT 1",
    "SELECT 1;",
    "  select 1 ;  ",
    "SELECT 1 AS one -- a trailing comment",
    "/* a leading comment */ SELECT 1",
    "SELECT 'delete from x; drop table y' AS text -- update",
    "SELECT 'pg_read_file(''/etc/passwd'')' AS text -- load_file(",
    "SELECT 'it''s' AS quoted, '' AS empty",
    "WITH t AS (SELECT 1 AS n UNION ALL SELECT 2) SELECT sum(n) AS total FROM t",
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 10) "
    "SELECT count(*), min(n), max(n), avg(n) FROM r",
    "SELECT n, CASE WHEN n > 1 THEN 'many' ELSE 'one' END AS label "
    "FROM (SELECT 1 AS n UNION ALL SELECT 2) AS t ORDER BY n DESC LIMIT 1",
    "SELECT n, row_number() OVER (ORDER BY n) AS rn, rank() OVER (ORDER BY n) AS r, "
    "lag(n) OVER (ORDER BY n) AS previous, sum(n) OVER (PARTITION BY n % 2) AS running "
    "FROM (SELECT 1 AS n UNION ALL SELECT 2 UNION ALL SELECT 3) AS t",
    "SELECT coalesce(NULL, 1) AS c, nullif(1, 1) AS n, abs(-2) AS a, round(2.567, 2) AS r, "
    "lower('ABC') AS l, upper('abc') AS u, length('abcd') AS len, replace('aXb', 'X', '-') AS rep",
    "SELECT CAST('12' AS INTEGER) + 1 AS twelve_plus",
    "SELECT a.n FROM (SELECT 1 AS n) AS a JOIN (SELECT 1 AS n) AS b ON a.n = b.n "
    "LEFT JOIN (SELECT 2 AS n) AS c ON c.n = a.n WHERE c.n IS NULL",
    "SELECT n FROM (SELECT 1 AS n) AS t WHERE n IN (SELECT 1) AND n BETWEEN 0 AND 2 "
    "AND EXISTS (SELECT 1) AND 'abc' LIKE 'a%' AND NOT n <> 1",
    "SELECT n % 2 AS parity, count(*) AS k FROM (SELECT 1 AS n UNION ALL SELECT 2) AS t "
    "GROUP BY n % 2 HAVING count(*) > 0 ORDER BY parity",
    "SELECT DISTINCT n FROM (SELECT 1 AS n UNION ALL SELECT 1) AS t",
    "SELECT 1 UNION SELECT 2 EXCEPT SELECT 2",
    "SELECT 1 INTERSECT SELECT 1",
    "SELECT trim('  x  ') AS t, substr('abcdef', 2, 3) AS s",
    "SELECT 'café' AS word, 'naïve ☕ 東京' AS more, 1 AS \"größe\"",
]

READS: dict[str, list[str]] = {
    "postgresql": [
        *COMMON_READS,
        "SELECT e'\\'' AS quote, E'\\\\' AS backslash, $$a ' b$$ AS dollars, "
        "$tag$ it's $$ nested $tag$ AS tagged",
        "SELECT U&'d\\0061t\\+000061' AS unicode, X'1F' AS bits, B'101' AS binary_bits",
        "SELECT '\\' AS backslash_is_plain_here",
        "SELECT now() - interval '1 day' AS yesterday, date_trunc('month', now()) AS m, "
        "extract(year FROM now()) AS y, to_char(now(), 'YYYY-MM') AS ym, "
        "age(timestamp '2020-01-01') AS since",
        "SELECT '{\"a\": {\"b\": 1}}'::jsonb -> 'a' ->> 'b' AS b, "
        "jsonb_build_object('k', 1) AS o, '[1,2]'::json -> 0 AS first",
        'SELECT x, y FROM jsonb_to_record(\'{"x": 1, "y": "z"}\') AS t(x int, y text)',
        "SELECT g, g::text || 'x' AS label FROM generate_series(1, 3) AS g",
        "SELECT unnest(ARRAY[1, 2, 3]) AS v, array_length(ARRAY[1, 2], 1) AS n",
        "SELECT string_agg(v, ', ' ORDER BY v) AS joined, array_agg(v) AS arr, "
        "count(*) FILTER (WHERE v > 'a') AS later FROM (VALUES ('a'), ('b')) AS t(v)",
        "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY v) AS median "
        "FROM (VALUES (1), (2), (3)) AS t(v)",
        "SELECT DISTINCT ON (v % 2) v FROM (VALUES (1), (2), (3)) AS t(v) ORDER BY v % 2, v",
        "SELECT 'abc' ~ '^a' AS re, 'ABC' ILIKE 'a%' AS il, 'x' IS DISTINCT FROM 'y' AS d",
        "SELECT relname, pg_size_pretty(pg_total_relation_size(c.oid)) AS size "
        "FROM pg_class AS c WHERE relkind = 'r' ORDER BY relname LIMIT 3",
        "SELECT table_name, column_name, data_type FROM information_schema.columns "
        "WHERE table_schema = 'public' ORDER BY 1, 2 LIMIT 5",
        "SELECT current_database() AS db, current_user AS who, version() AS v",
        "VALUES (1, 'a'), (2, 'b')",
        "EXPLAIN SELECT 1",
        "EXPLAIN (ANALYZE, FORMAT JSON) SELECT 1",
        "explain analyze verbose select count(*) from generate_series(1, 10)",
        "SELECT to_tsvector('english', 'the quick fox') @@ to_tsquery('english', 'fox') AS hit",
        "SELECT 2 ^ 10 AS p, 7 / 2 AS d, 7 % 2 AS m, |/ 16.0 AS root, greatest(1, 2) AS g",
        "SELECT v FROM (VALUES (1), (2)) AS t(v) ORDER BY v FETCH FIRST 1 ROWS ONLY",
        "/* one /* nested */ comment */ SELECT 1",
    ],
    "mysql": [
        *COMMON_READS,
        "SELECT 'it\\'s' AS with_escape, \"double quoted\" AS d, X'41' AS hex, 0x42 AS hex2",
        "SELECT _utf8mb4'abc' AS introduced, N'national' AS n",
        "SELECT `n` FROM (SELECT 1 AS `n`) AS `t`",
        "SELECT 1 # a MySQL comment\n, 2",
        "SELECT 1--1 AS minus_minus_one",
        "SELECT IFNULL(NULL, 'x') AS f, IF(1 > 0, 'y', 'n') AS i, CONCAT('a', 'b') AS c, "
        "DATE_FORMAT(NOW(), '%Y-%m') AS ym, DATEDIFF('2024-01-02', '2024-01-01') AS dd",
        "SELECT GROUP_CONCAT(v ORDER BY v SEPARATOR ',') AS g FROM "
        "(SELECT 'a' AS v UNION ALL SELECT 'b') AS t",
        "SELECT JSON_EXTRACT('{\"a\": 1}', '$.a') AS a, JSON_OBJECT('k', 1) AS o",
        "SELECT TIMESTAMPDIFF(DAY, '2024-01-01', '2024-01-31') AS days, "
        "STR_TO_DATE('2024-05-06', '%Y-%m-%d') AS d, YEAR(NOW()) AS y",
        "SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE() "
        "ORDER BY table_name LIMIT 5",
        "SELECT @@version AS v, VERSION() AS v2",
        "EXPLAIN SELECT 1",
        "EXPLAIN FORMAT=JSON SELECT 1",
        "SELECT 5 DIV 2 AS d, 5 MOD 2 AS m",
    ],
    "sqlite": [
        *COMMON_READS,
        'SELECT "n", [n], `n` FROM (SELECT 1 AS n)',
        "SELECT strftime('%Y', 'now') AS y, date('now', '-1 day') AS yesterday, "
        "julianday('2024-01-02') - julianday('2024-01-01') AS days",
        "SELECT ifnull(NULL, 1) AS f, iif(1, 'y', 'n') AS i, instr('abc', 'b') AS p, "
        "substr('00000' || 42, -5) AS padded, typeof(1.5) AS t, total(1) AS tot",
        "SELECT json_extract('{\"a\": [1, 2]}', '$.a[1]') AS second, json_array(1, 2) AS arr",
        "SELECT value FROM json_each('[1, 2, 3]')",
        "SELECT name, type FROM sqlite_master ORDER BY name",
        "SELECT name FROM pragma_table_info('sqlite_master')",
        "SELECT group_concat(v, '-') AS g FROM (SELECT 'a' AS v UNION ALL SELECT 'b')",
        "SELECT X'41' AS blob_literal",
        "EXPLAIN QUERY PLAN SELECT 1",
        "EXPLAIN SELECT 1",
    ],
}

#: Not a read in one dialect, where its comments or strings end elsewhere than in the
#: others (in those it is a harmless read): MySQL runs the text of ``/*! … */``; a
#: backslash escapes a quote in MySQL's strings and in no one else's.
DIALECT_ATTACKS: dict[str, list[str]] = {
    "mysql": [
        "SELECT 1 /*!, load_file('/etc/hostname') */",
        "SELECT 1 /*!50000, load_file('/etc/hostname') */",
        "SELECT 1 /*M!, load_file('/etc/hostname') */",
        "SELECT 1 /*!, SLEEP(5) */ AS one",
        "SELECT 'a\\'', load_file('/etc/hostname') -- '",
        # A space between a name and its parenthesis calls a stored function of that name.
        "SELECT count (id) FROM orders",
        "SELECT lower /* c */ ('A')",
        "SELECT CAST (1 AS CHAR)",
        "SELECT iif(1, 2, 3)",
        # Where the server keeps password hashes (the second pass).
        "SELECT * FROM mysql.user",
        "SELECT * FROM `mysql`.`global_priv`",
        # PCRE's backtracking (the second pass): REGEXP / RLIKE and the REGEXP_ functions.
        "SELECT 'aaaa!' REGEXP '^(\\\\w+\\\\s?)*$'",
        "SELECT 'aaaa!' RLIKE '^(a+)+$'",
        "SELECT 'aaaa!' NOT REGEXP '^(a+)+$'",
        "SELECT REGEXP_REPLACE('aaaa!', '^(a+)+$', 'x')",
        "SELECT REGEXP_SUBSTR('aaaa!', '^(a+)+$')",
        "SELECT REGEXP_INSTR('aaaa!', '^(a+)+$')",
        "SELECT REGEXP_LIKE('aaaa!', '^(a+)+$')",
        "SELECT glob('a*', 'abc')",
        "SELECT like('a%', 'abc')",
    ],
    "postgresql": [
        "SELECT '\\', pg_read_file('/etc/hostname') --'",
        # A function in FROM is a read elsewhere (MySQL and SQLite refuse to run it).
        "SELECT q.ts_stat FROM concat('SELECT to_tsvector(pg_sleep(1)::text)') AS q",
        # Built in elsewhere (MySQL's IF, SQLite's iif, glob and like), not here.
        "SELECT if(true, 1, 2)",
        "SELECT iif(true, 1, 2)",
        "SELECT glob('a*', 'abc')",
        "SELECT like('a%', 'abc')",
        # Where the server keeps password hashes (the second pass).
        "SELECT rolpassword FROM pg_authid",
        "SELECT * FROM pg_catalog.pg_shadow",
        # A width of 1 GB (MySQL's FORMAT(X, D) is another function).
        "SELECT length(format('%1000000000s', 'x'))",
        # MySQL / MariaDB keep these: a result over max_allowed_packet is NULL there.
        "SELECT length(repeat('x', 1000000000))",
        "SELECT length(lpad('', 1000000000, 'x'))",
        "SELECT length(rpad('', 1000000000, 'x'))",
    ],
    "sqlite": [
        "SELECT '\\', load_extension('x') --'",
        "SELECT if(1, 2, 3)",
        "SELECT format('%2000000000d', 1)",  # MySQL's FORMAT(X, D) is another function
    ],
}

NBSP = "\u00a0"

#: Not a read in any dialect. Each is refused before it reaches a database: on a read-only
#: datasource without asking, on a writable one only once a person approves it.
ATTACKS = [
    # Found by the adversarial pass of issue 25: a Unicode space is whitespace to the
    # parser's tokenizer and part of a name to PostgreSQL (and no comment's end to MySQL).
    f"SELECT interval{NBSP}$a$, pg_sleep(1) AS z{NBSP}$a$ "
    f'FROM (SELECT 1 AS "interval{NBSP}$a$") AS t',
    f"SELECT t.x --{NBSP}, GET_LOCK('paw', 0)\nFROM (SELECT 1 AS x) AS t",
    "SELECT 1\u2028, pg_sleep(1)",
    "SELECT 1\u3000AS x",
    "SELECT 1\u200b",
    "SELECT 1\ufeff",
    "SELECT 1\x00",
    # PostgreSQL reads (expr).f as f(expr): any one-argument function, ts_stat runs SQL.
    "SELECT (3).pg_sleep",
    "SELECT (q).ts_stat FROM (SELECT 'SELECT to_tsvector(pg_sleep(1)::text)' AS q) AS t",
    'SELECT (x)."pg_sleep" FROM (SELECT 1 AS x) AS t',
    "SELECT ((x)).pg_sleep FROM (SELECT 1 AS x) AS t",
    "SELECT (t.x).pg_terminate_backend FROM (SELECT 1 AS x) AS t",
    "SELECT (SELECT 1).pg_sleep",
    "SELECT CAST(1 AS int).pg_sleep",
    "SELECT ('is_superuser').current_setting",
    # ... and so is q.f of a function q in FROM that has no column f (the second pass).
    "SELECT q.pg_advisory_lock FROM int8(42) AS q",
    "SELECT g.pg_sleep FROM generate_series(1, 1) AS g",
    "SELECT 1 FROM t, LATERAL int8(42) AS k WHERE k.pg_advisory_lock IS NULL",
    "SELECT j.pg_sleep FROM jsonb_each('{}') AS j",
    "SELECT * FROM pg_catalog.generate_series(1, 2)",
    # Names the parser reads with a grammar of its own, which no database here has built
    # in: a user-defined function of that name would run.
    "SELECT max_by(a, b) FROM t",
    "SELECT arg_max(a, b) FROM t",
    "SELECT try_cast(a AS int) FROM t",
    # ... or maps to a node it judged by kind (the second pass): IF( → If, VAR_MAP( →
    # Array, TS_OR_DS_TO_DATE_STR( → Cast; and a Unicode look-alike of an allowed name
    # (U+212A KELVIN SIGN is "k" in Python's lower case, a letter of its own to PostgreSQL).
    "SELECT var_map(1, 2)",
    "SELECT ts_or_ds_to_date_str(1)",
    "SELECT ran\u212a() OVER ()",
    "SELECT \u212aount(*) FROM t",
    # Issue 25's findings: side-effect functions with a comment before the parenthesis.
    "SELECT pg_read_file/**/('/etc/hostname') AS f",
    "SELECT pg_terminate_backend/**/(pid) FROM pg_stat_activity "
    "WHERE datname = current_database() AND pid <> pg_backend_pid()",
    "SELECT set_config/**/('default_transaction_read_only','off',false), "
    "pg_advisory_lock/**/(42), pg_notify/**/('ch','x')",
    "SELECT pg_read_file--x\n('/etc/hostname')",
    "SELECT E'\\'', pg_read_file('/etc/hostname')",
    # Comments in every position.
    "SELECT /* c */ pg_read_file /* c */ ( /* c */ '/etc/hostname' /* c */ ) /* c */",
    "SELECT\tpg_read_file\n(\n'/etc/hostname'\n)",
    "SELECT pg_read_file -- a\n -- b\n ('/etc/hostname')",
    "SELECT pg_read_file/* /* nested */ */('/etc/hostname')",
    "SELECT load_file # x\n('/etc/hostname')",
    # Strings that end where a careless reader does not expect.
    "SELECT $$ ' $$, pg_read_file('/etc/hostname')",
    "SELECT $x$ $$ ' $x$, pg_read_file('/etc/hostname')",
    "SELECT e'\\\\', pg_read_file('/etc/hostname')",
    "SELECT U&'\\0027', pg_read_file('/etc/hostname')",
    "SELECT 'x' 'y', load_file('/etc/hostname')",
    # Case, schema-qualified and quoted names, Unicode-escaped names.
    "SELECT PG_READ_FILE('/etc/hostname')",
    "SELECT Pg_Terminate_Backend(0)",
    "SELECT pg_catalog.pg_read_file('/etc/hostname')",
    'SELECT "pg_catalog"."pg_read_file"(\'/etc/hostname\')',
    "SELECT \"pg_read_file\"('/etc/hostname')",
    'SELECT pg_catalog."pg_terminate_backend" (1)',
    "SELECT `load_file`('/etc/hostname')",
    "SELECT [load_extension]('x')",
    "SELECT U&\"\\0070g_read_file\"('/etc/hostname')",
    "SELECT pg_catalog.lower('A')",  # qualified: never a read, even when harmless
    # Side effects of every dialect.
    "SELECT pg_cancel_backend(0)",
    "SELECT pg_sleep(1)",
    "SELECT lo_export(1, '/tmp/x')",
    "SELECT lo_import('/etc/hostname')",
    "SELECT nextval('s')",
    "SELECT setval('s', 1)",
    "SELECT * FROM dblink('host=x', 'DELETE FROM t') AS t(n int)",
    "SELECT query_to_xml('SELECT pg_read_file(''/etc/hostname'')', true, true, '')",
    "SELECT * FROM pg_ls_dir('.')",
    "SELECT * FROM ROWS FROM (pg_read_file('/etc/hostname'))",
    "SELECT (SELECT pg_sleep(1))",
    "SELECT 1 WHERE EXISTS (SELECT lo_import('/etc/hostname'))",
    "SELECT LOAD_FILE('/etc/passwd')",
    "SELECT SLEEP(1)",
    "SELECT BENCHMARK(1000000, MD5('x'))",
    "SELECT GET_LOCK('paw', 0)",
    "SELECT RELEASE_LOCK('paw')",
    "SELECT LAST_INSERT_ID(5)",
    "SELECT load_extension('x')",
    "SELECT writefile('/tmp/x', 'y')",
    "SELECT randomblob(1000000000)",
    # A size to allocate as an argument (the second pass): SQLite's printf / format width.
    "SELECT printf('%.*c', 2000000000, 'x')",
    "SELECT zeroblob(2000000000)",
    "SELECT length(printf('%05d', 42))",
    # PostgreSQL's size-taking functions (the second pass): up to 1 GB at once, which
    # neither statement_timeout nor work_mem bounds.
    "SELECT cardinality(array_fill(1, ARRAY[100000000]))",
    "SELECT string_agg(repeat('x', 1000000), '') FROM generate_series(1, 1000) AS g",
    "SELECT shop_sneaky()",  # a user-defined function
    # Writes dressed as reads.
    "WITH gone AS (DELETE FROM orders RETURNING *) SELECT * FROM gone",
    "WITH x AS (UPDATE orders SET total = 0 RETURNING 1) SELECT 1",
    "EXPLAIN ANALYZE DELETE FROM orders",
    "EXPLAIN (ANALYZE) INSERT INTO orders VALUES (1)",
    "EXPLAIN SELECT 1; DROP TABLE orders",
    "SELECT * INTO copy FROM orders",
    "SELECT 1 INTO OUTFILE '/tmp/x'",
    "SELECT 1 INTO DUMPFILE '/tmp/x'",
    "SELECT * FROM orders INTO OUTFILE '/tmp/x'",
    "SELECT 1 INTO @v",
    "SELECT @v := 1",
    "SELECT * FROM orders FOR UPDATE",
    "SELECT * FROM orders FOR SHARE NOWAIT",
    "SELECT * FROM orders LOCK IN SHARE MODE",
    "SELECT * FROM orders WHERE id IN (SELECT id FROM orders FOR UPDATE)",
    "SELECT 1; DROP TABLE orders",
    "SELECT 1;DELETE FROM orders",
    "SELECT 1 /* ; */ ; DELETE FROM orders",
    # Commands.
    "DELETE FROM orders",
    "UPDATE orders SET total = 0",
    "INSERT INTO orders VALUES (1)",
    "MERGE INTO orders USING x ON true WHEN MATCHED THEN DELETE",
    "CALL p()",
    "DO $$ BEGIN PERFORM pg_sleep(1); END $$",
    "COPY orders TO PROGRAM 'id'",
    "COPY (SELECT 1) TO PROGRAM 'touch /tmp/x'",
    "LOAD DATA INFILE '/etc/passwd' INTO TABLE orders",
    "LOAD DATA LOCAL INFILE '/etc/passwd' INTO TABLE orders",
    "PRAGMA writable_schema = 1",
    "PRAGMA journal_mode=WAL",
    "ATTACH DATABASE '/tmp/x.db' AS x",
    "DETACH DATABASE x",
    "VACUUM INTO '/tmp/x.db'",
    "SET default_transaction_read_only = off",
    "SET SESSION TRANSACTION READ WRITE",
    "SHOW search_path",
    "LISTEN ch",
    "NOTIFY ch",
    "PREPARE p AS SELECT 1",
    "EXECUTE p",
    "BEGIN",
    "COMMIT",
    "GRANT ALL ON orders TO PUBLIC",
    "CREATE TABLE x AS SELECT 1",
    "DROP TABLE orders",
    "TRUNCATE orders",
    "HANDLER orders OPEN",
    "KILL 1",
    "DESCRIBE orders",
    "ANALYZE SELECT 1",
    "",
    "   ",
    "-- only a comment",
    "/* only a comment */",
    ";",
    "SELEC 1",
]
