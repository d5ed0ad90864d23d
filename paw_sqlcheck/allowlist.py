"""What a read may contain: the parse-tree nodes, the operators and syntax-made functions,
and per dialect the functions it may call by name.

Everything here is an allow-list: a node type, an operator or a function that is not
named is not a read (a new sqlglot node type, an extension's function, a user-defined
function). The names of node types are sqlglot's classes (``sqlglot.expressions``); the
function names are the databases' own, from their manuals:

- PostgreSQL 17, "Functions and Operators" (chapter 9): string, numeric, date/time,
  JSON, array, range, text search, aggregate, window, conditional and the harmless part
  of "System Information Functions" (chapter 9.27) — none of "System Administration
  Functions" (9.28: signalling backends, files, settings, advisory locks, WAL),
  sequence functions (``nextval``, ``setval``), large objects, ``dblink``, ``pg_notify``,
  ``pg_sleep`` or ``query_to_xml`` (which runs the SQL text it is given); nor the
  functions whose argument is a size to allocate: ``repeat``, ``lpad``, ``rpad``,
  ``format`` (its widths, ``%1000000000s``) and ``array_fill`` make a value of up to
  1 GB at once, which neither ``statement_timeout`` (it is made in well under the
  timeout) nor ``work_mem`` (it is no sort or hash) bounds. ``generate_series`` and the
  aggregates stay: in FROM a function's rows go to a tuplestore that spills to disk past
  ``work_mem``, in the select list they stream, and ``string_agg`` / ``array_agg`` grow
  one row at a time, at the pace rows are read, up to PostgreSQL's 1 GB per value
  within ``statement_timeout``.
- MySQL 8.4 / MariaDB 11, "Functions and Operators" (chapter 14): string, numeric,
  date/time, JSON, aggregate, window, cast, flow control, encryption's pure functions and
  harmless information functions — not the regular expressions (``REGEXP``, ``RLIKE``,
  ``REGEXP_REPLACE`` / ``_SUBSTR`` / ``_INSTR`` / ``_LIKE``: PCRE's backtracking), nor
  ``LOAD_FILE``, ``SLEEP``, ``BENCHMARK``,
  ``GET_LOCK`` / ``RELEASE_LOCK``, ``LAST_INSERT_ID(expr)`` (which sets it) or
  ``SOURCE_POS_WAIT``.
- SQLite 3.45, "Built-in Scalar SQL Functions", "Date And Time Functions", "Built-in
  Aggregate Functions", "Window Functions", "Mathematical Functions", "JSON Functions" and
  the table-valued pragma functions without side effects — not ``load_extension``, the
  shell's ``readfile`` / ``writefile`` / ``edit``, ``fts3_tokenizer``, nor the functions
  whose argument is a size to allocate: ``randomblob`` / ``zeroblob`` and ``printf`` /
  ``format`` (``printf('%.*c', 2000000000, 'x')`` asks for 2 GB). What still builds a
  big value from a small statement (``replace`` of ``replace``, ``||`` in a recursive
  CTE) is bounded by the connection: both sides open SQLite with
  ``SQLITE_LIMIT_LENGTH`` at ``paw_sqlcheck.SQLITE_MAX_LENGTH``.
"""

from __future__ import annotations

#: Node types a read's tree may hold besides function calls (checked separately): the
#: query's clauses, its operators, literals, names and types. Not here, so never in a
#: read: every statement other than a query (DML, DDL, COPY, PRAGMA, ATTACH, SET, SHOW,
#: CALL, ``Command``...), ``Into`` (``SELECT … INTO``, ``INTO OUTFILE``), ``Lock``
#: (``FOR UPDATE`` / ``FOR SHARE`` / ``LOCK IN SHARE MODE``), ``PropertyEQ`` (MySQL's
#: ``@v := …`` assignment), ``Operator`` (PostgreSQL's ``OPERATOR(schema.op)``, a
#: user-defined operator), optimizer ``Hint`` comments (MySQL's ``SET_VAR``).
READ_NODES = frozenset(
    {
        # The query and its clauses.
        "Select", "Union", "Intersect", "Except", "Subquery", "Values", "With", "CTE",
        "RecursiveWithSearch", "From", "Join", "Lateral", "Table", "TableAlias",
        "TableSample", "TableColumn", "IndexTableHint", "Where", "Group", "Cube", "Rollup",
        "GroupingSets", "Having", "Qualify", "Order", "Ordered", "Limit", "Offset", "Fetch",
        "LimitOptions", "Distinct", "Window", "WindowSpec", "Filter", "WithinGroup",
        "IgnoreNulls", "RespectNulls", "Tuple", "Star", "Alias", "Aliases", "Column",
        "Identifier", "Dot", "Var", "Parameter", "SessionParameter", "Lambda", "Kwarg",
        "Variadic", "ColumnDef", "OnCondition", "Semicolon",
        # Literals.
        "Literal", "Boolean", "Null", "HexString", "BitString", "ByteString", "RawString",
        "UnicodeString", "National", "Introducer", "Interval", "IntervalSpan",
        # Types (casts).
        "DataType", "DataTypeParam", "PseudoType", "ObjectIdentifier",
        # Operators.
        "Add", "Sub", "Mul", "Div", "IntDiv", "Mod", "Neg", "Paren", "Not", "EQ", "NEQ",
        "GT", "GTE", "LT", "LTE", "NullSafeEQ", "NullSafeNEQ", "Is", "In", "Between",
        "Like", "ILike", "Glob", "SimilarTo", "Escape", "Any", "All", "DPipe", "BitwiseAnd",
        "BitwiseOr", "BitwiseXor", "BitwiseNot", "BitwiseLeftShift", "BitwiseRightShift",
        "Bracket", "Slice", "AtTimeZone", "FromTimeZone", "Overlaps", "Distance",
        "Adjacent", "ExtendsLeft", "ExtendsRight",
        # JSON paths (``->``, ``->>``, JSON_TABLE's columns).
        "JSONPath", "JSONPathRoot", "JSONPathKey", "JSONPathSubscript", "JSONPathWildcard",
        "JSONPathSlice", "JSONPathUnion", "JSONPathFilter", "JSONPathSelector",
        "JSONPathRecursive", "JSONKeyValue", "FormatJson", "JSONSchema", "JSONColumnDef",
        "JSONValue",
    }
)  # fmt: skip

#: Functions the parser makes from syntax rather than from a name followed by ``(``:
#: operators (``AND``, ``~``, ``@>``, ``->``), ``CASE``, ``CAST`` / ``::``, ``EXISTS``,
#: keyword functions (``CURRENT_DATE``, ``CURRENT_USER``) and the functions with a
#: grammar of their own (``EXTRACT(… FROM …)``, ``POSITION(… IN …)``, ``TRIM(…)``,
#: ``SUBSTRING(… FROM …)``, ``GROUP_CONCAT(… SEPARATOR …)``...). A call by name is
#: judged by its name instead (:data:`FUNCTIONS`). ``TsOrDsTo*`` are the conversions the
#: parser wraps around a date function's argument (``STRFTIME('%Y', d)``), not calls.
SYNTAX_FUNCTIONS = frozenset(
    {
        "And", "Or", "Xor", "Pow", "RegexpLike", "RegexpILike", "ArrayContainsAll",
        "ArrayContainedBy", "ArrayOverlaps", "ArrayContains", "Array", "Exists", "Case",
        "If", "Cast", "TryCast", "CastToStrType", "Collate", "Extract", "Substring", "Trim",
        "StrPosition", "Overlay", "Ceil", "Floor", "Chr", "Initcap", "Normalize",
        "WeightString", "JSONObject", "JSONObjectAgg", "JSONArrayAgg", "JSONArray",
        "JSONBExists", "JSONTable", "JSONExtract", "JSONExtractScalar",
        "JSONBExtract", "JSONBExtractScalar", "JSONBContains", "GroupConcat", "ArgMax",
        "ArgMin", "MatchAgainst", "XMLElement", "XMLTable",
        "CurrentDate", "CurrentTime", "CurrentTimestamp", "CurrentDatetime", "CurrentUser",
        "CurrentRole", "CurrentSchema", "CurrentCatalog", "SessionUser", "Localtime",
        "Localtimestamp", "Sqrt", "Cbrt", "Abs", "TsOrDsToDate", "TsOrDsToTimestamp",
        "TsOrDsToDatetime", "TsOrDsToTime",
    }
)  # fmt: skip

#: Syntax-made functions allowed by kind elsewhere (:data:`SYNTAX_FUNCTIONS`) but not in
#: a dialect's reads. MySQL / MariaDB: ``REGEXP`` / ``RLIKE`` (and the ``REGEXP_*``
#: functions, off its list below) run PCRE, whose backtracking on a pattern like
#: ``^(\w+\s?)*$`` spends up to its match limit (10 million steps, about 0.4 s) on every
#: row, which ``max_statement_time`` only stops between rows.
SYNTAX_REFUSED: dict[str, frozenset[str]] = {
    "postgresql": frozenset(),
    "mysql": frozenset({"RegexpLike", "RegexpILike"}),
    "sqlite": frozenset(),
}

#: Tables and views a read never names, per dialect (lower case; PostgreSQL's by their
#: own name in any schema, MySQL's as ``database.table``): where the server keeps
#: password hashes (``pg_authid``, ``pg_shadow``, ``mysql.user``, ``mysql.global_priv``),
#: the passwords of foreign-server user mappings (``pg_user_mappings``) and the contents
#: of large objects (``pg_largeobject``). The database's grants refuse them to a reader
#: too (the second wall); this refuses them to a privileged user PAW was told to accept.
SECRET_TABLES: dict[str, frozenset[str]] = {
    "postgresql": frozenset({"pg_authid", "pg_shadow", "pg_user_mappings", "pg_largeobject"}),
    "mysql": frozenset({"mysql.user", "mysql.global_priv"}),
    "sqlite": frozenset(),
}

_AGGREGATE_AND_WINDOW = """
    avg count max min sum
    row_number rank dense_rank percent_rank cume_dist ntile lag lead first_value
    last_value nth_value
"""

_POSTGRESQL = (
    _AGGREGATE_AND_WINDOW
    + """
    any_value array_agg bit_and bit_or bit_xor bool_and bool_or every json_agg jsonb_agg
    json_object_agg jsonb_object_agg json_arrayagg json_objectagg range_agg
    range_intersect_agg string_agg xmlagg corr covar_pop covar_samp regr_avgx regr_avgy
    regr_count regr_intercept regr_r2 regr_slope regr_sxx regr_sxy regr_syy stddev
    stddev_pop stddev_samp variance var_pop var_samp mode percentile_cont percentile_disc
    grouping
    coalesce nullif greatest least num_nulls num_nonnulls
    abs cbrt ceil ceiling degrees div exp factorial floor gcd lcm ln log log10 min_scale
    mod pi power radians round scale sign sqrt trim_scale trunc width_bucket random
    acos acosd asin asind atan atand atan2 atan2d cos cosd cot cotd sin sind tan tand sinh
    cosh tanh asinh acosh atanh erf erfc
    ascii bit_length btrim char_length character_length chr concat concat_ws convert_from
    convert_to decode encode initcap left length lower ltrim md5 normalize
    octet_length overlay parse_ident position quote_ident quote_literal quote_nullable
    regexp_count regexp_instr regexp_like regexp_match regexp_matches regexp_replace
    regexp_split_to_array regexp_split_to_table regexp_substr replace reverse
    right rtrim sha224 sha256 sha384 sha512 split_part starts_with string_to_array
    string_to_table strpos substr substring to_ascii to_hex translate trim unistr upper
    casefold get_bit get_byte bit_count
    age clock_timestamp date_add date_bin date_part date_subtract date_trunc extract
    isfinite justify_days justify_hours justify_interval make_date make_interval
    make_time make_timestamp make_timestamptz now statement_timestamp timeofday
    transaction_timestamp to_char to_date to_number to_timestamp timezone
    array_append array_cat array_dims array_length array_lower array_ndims
    array_position array_positions array_prepend array_remove array_replace
    array_to_string array_upper cardinality trim_array unnest generate_series
    generate_subscripts
    to_json to_jsonb array_to_json row_to_json json_build_array jsonb_build_array
    json_build_object jsonb_build_object json_object jsonb_object json_array
    json_array_length jsonb_array_length json_each jsonb_each json_each_text
    jsonb_each_text json_extract_path jsonb_extract_path json_extract_path_text
    jsonb_extract_path_text json_object_keys jsonb_object_keys json_populate_record
    jsonb_populate_record json_populate_recordset jsonb_populate_recordset
    json_array_elements jsonb_array_elements json_array_elements_text
    jsonb_array_elements_text json_typeof jsonb_typeof json_to_record jsonb_to_record
    json_to_recordset jsonb_to_recordset json_strip_nulls jsonb_strip_nulls jsonb_set
    jsonb_set_lax jsonb_insert jsonb_pretty jsonb_path_exists jsonb_path_match
    jsonb_path_query jsonb_path_query_array jsonb_path_query_first json_scalar
    isempty lower_inc upper_inc lower_inf upper_inf range_merge int4range int8range
    numrange tsrange tstzrange daterange multirange
    to_tsvector to_tsquery plainto_tsquery phraseto_tsquery websearch_to_tsquery ts_rank
    ts_rank_cd ts_headline setweight strip numnode querytree tsvector_to_array
    array_to_tsvector
    host hostmask masklen netmask network broadcast family abbrev inet_same_family
    inet_merge
    gen_random_uuid
    date time timestamp timestamptz text int int2 int4 int8 integer bigint smallint
    numeric float4 float8 bool varchar
    cast convert date_part jsonb_exists json_objectagg json_table json_value xmlelement
    xmltable xmlagg
    current_database current_catalog current_schema current_schemas current_user
    current_role session_user user version pg_typeof format_type to_regclass to_regtype
    col_description obj_description pg_get_viewdef pg_get_constraintdef pg_get_indexdef
    pg_get_expr pg_get_userbyid pg_table_is_visible has_table_privilege
    has_column_privilege has_schema_privilege pg_relation_size pg_total_relation_size
    pg_table_size pg_indexes_size pg_database_size pg_size_pretty pg_column_size
    """
)

_MYSQL = (
    _AGGREGATE_AND_WINDOW
    + """
    bit_and bit_or bit_xor group_concat std stddev stddev_pop stddev_samp var_pop
    var_samp variance json_arrayagg json_objectagg
    if ifnull nullif coalesce greatest least isnull interval
    abs acos asin atan atan2 ceil ceiling conv cos cot crc32 degrees exp floor ln log
    log10 log2 mod pi pow power radians rand round sign sin sqrt tan truncate
    ascii bin bit_length char char_length character_length concat concat_ws elt
    export_set field find_in_set format from_base64 hex insert instr lcase left length
    locate lower lpad ltrim make_set mid oct octet_length ord position quote
    repeat replace reverse right
    rpad rtrim soundex space strcmp substr substring substring_index to_base64 trim ucase
    unhex upper weight_string
    adddate addtime convert_tz curdate current_date current_time current_timestamp
    curtime date date_add date_format date_sub datediff day dayname dayofmonth dayofweek
    dayofyear extract from_days from_unixtime get_format hour last_day localtime
    localtimestamp makedate maketime microsecond minute month monthname now period_add
    period_diff quarter sec_to_time second str_to_date subdate subtime sysdate time
    time_format time_to_sec timediff timestamp timestampadd timestampdiff to_days
    to_seconds unix_timestamp utc_date utc_time utc_timestamp week weekday weekofyear
    year yearweek
    json_array json_array_append json_array_insert json_contains json_contains_path
    json_depth json_extract json_insert json_keys json_length json_merge_patch
    json_merge_preserve json_object json_overlaps json_pretty json_quote json_remove
    json_replace json_search json_set json_storage_size json_table json_type
    json_unquote json_valid json_value
    cast convert binary chr decode json_objectagg match weight_string
    md5 sha sha1 sha2 aes_encrypt aes_decrypt compress uncompress uncompressed_length
    random_bytes uuid uuid_short uuid_to_bin bin_to_uuid is_uuid inet_aton inet_ntoa
    inet6_aton inet6_ntoa is_ipv4 is_ipv6
    database schema user current_user session_user system_user version charset
    collation coercibility connection_id found_rows row_count
    """
)

_SQLITE = (
    _AGGREGATE_AND_WINDOW
    + """
    group_concat string_agg total cast
    abs char coalesce concat concat_ws glob hex ifnull iif instr length like
    likelihood likely lower ltrim nullif octet_length quote random replace round
    rtrim sign soundex sqlite_version substr substring trim typeof unhex unicode
    unlikely upper changes total_changes last_insert_rowid
    date time datetime julianday unixepoch strftime timediff
    acos acosh asin asinh atan atan2 atanh ceil ceiling cos cosh degrees exp floor ln log
    log10 log2 mod pi pow power radians sin sinh sqrt tan tanh trunc
    json json_array json_array_length json_error_position json_extract json_insert
    json_object json_patch json_remove json_replace json_set json_type json_valid
    json_quote json_group_array json_group_object json_each json_tree jsonb
    jsonb_array jsonb_extract jsonb_insert jsonb_object jsonb_patch jsonb_remove
    jsonb_replace jsonb_set jsonb_group_array jsonb_group_object
    pragma_table_info pragma_table_xinfo pragma_table_list pragma_index_list
    pragma_index_info pragma_index_xinfo pragma_foreign_key_list
    """
)

#: The functions a read may call by name, per dialect (lower-case; a name is compared
#: without case, and a quoted or schema-qualified name is never a read: it names a
#: user-defined function).
FUNCTIONS: dict[str, frozenset[str]] = {
    "postgresql": frozenset(_POSTGRESQL.split()),
    "mysql": frozenset(_MYSQL.split()),
    "sqlite": frozenset(_SQLITE.split()),
}
