//! The twin query language's statement (QRY-1): `SELECT [TOP n] projections FROM collection
//! [WHERE condition] [GROUP BY paths]`, on the expression grammar of `parse` in its twin
//! dialect.
//!
//! ```text
//! statement  := SELECT [TOP integer] ("*" | item ("," item)*) FROM collection
//!               [WHERE expression] [GROUP BY path ("," path)*]
//! item       := (aggregate | expression) [AS name]
//! aggregate  := COUNT "(" ")" | (SUM | AVG | MIN | MAX) "(" expression ")"
//! collection := devices | devices.modules | devices.jobs
//! ```
//!
//! # Invariants
//! - Every path is rooted at the row and written canonically once parsed: a leading
//!   `devices.` / `devices.modules.` / `devices.jobs.` is dropped, and the first name is
//!   matched case-insensitively against the row's top-level fields (`DeviceId` is
//!   `deviceId`), as is `desired` / `reported` under `properties`. Names below are
//!   case-sensitive.
//! - Output names are unique: an alias as written, a path's last name, or `$1`, `$2`, ... for
//!   other expressions.
//! - With aggregates or GROUP BY, every plain item is one of the grouped paths; aggregates
//!   appear only as items.

use super::ast::{Expr, Step};
use super::lex::{BinOp, Tok};
use super::parse::{parse_expression, unexpected, Cursor, Parsed};
use super::QueryError;

/// Longest query text, as IoT Hub documents it.
pub const MAX_QUERY_LEN: usize = 8_192;

/// What a query reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Collection {
    Devices,
    Modules,
    Jobs,
}

/// An aggregate function of the select list.
#[derive(Debug, Clone)]
pub(crate) enum Aggregate {
    Count,
    Sum(Expr),
    Avg(Expr),
    Min(Expr),
    Max(Expr),
}

/// One item of the select list and its output name.
#[derive(Debug, Clone)]
pub(crate) struct Item {
    pub(crate) value: ItemValue,
    pub(crate) name: String,
}

#[derive(Debug, Clone)]
pub(crate) enum ItemValue {
    Plain(Expr),
    Aggregate(Aggregate),
}

/// The select list.
#[derive(Debug, Clone)]
pub(crate) enum Projection {
    Star,
    Items(Vec<Item>),
}

/// A parsed twin query.
#[derive(Debug, Clone)]
pub struct Statement {
    pub(crate) top: Option<usize>,
    pub(crate) projection: Projection,
    pub from: Collection,
    pub(crate) filter: Option<Expr>,
    pub(crate) group_by: Vec<Vec<Step>>,
}

/// Top-level fields of a device or module twin row, as the row spells them.
const TWIN_ROOTS: &[&str] = &[
    "deviceId",
    "moduleId",
    "etag",
    "deviceEtag",
    "status",
    "statusReason",
    "statusUpdateTime",
    "connectionState",
    "lastActivityTime",
    "cloudToDeviceMessageCount",
    "authenticationType",
    "x509Thumbprint",
    "modelId",
    "version",
    "tags",
    "properties",
    "capabilities",
    "deviceScope",
    "parentScopes",
    "configurations",
];

/// Top-level fields of a device job row.
const JOB_ROOTS: &[&str] = &[
    "deviceId",
    "moduleId",
    "jobId",
    "jobType",
    "status",
    "startTimeUtc",
    "endTimeUtc",
    "createdDateTimeUtc",
    "lastUpdatedDateTimeUtc",
    "outcome",
    "error",
];

impl Statement {
    /// Parses a query.
    ///
    /// # Errors
    /// [`QueryError`] naming the position of the first problem.
    pub fn parse(text: &str) -> Result<Statement, QueryError> {
        let length = text.chars().count();
        if length > MAX_QUERY_LEN {
            return Err(QueryError::TooLong {
                pos: MAX_QUERY_LEN,
                max: MAX_QUERY_LEN,
            });
        }
        if text.trim().is_empty() {
            return Err(QueryError::Invalid {
                pos: 0,
                message: "the query is empty".into(),
            });
        }
        let mut c = Cursor::twin(text)?;
        expect_keyword(&mut c, "select", "SELECT")?;
        let top = top(&mut c)?;
        let projection = if c.eat(&Tok::Op(BinOp::Mul, "*")) {
            Projection::Star
        } else {
            Projection::Items(items(&mut c)?)
        };
        expect_keyword(&mut c, "from", "FROM")?;
        let from = collection(&mut c)?;
        let filter = if c.eat_keyword("where") {
            Some(parse_expression(&mut c)?)
        } else {
            None
        };
        let group_pos = c.peek().pos;
        let mut group_by = Vec::new();
        if c.eat_keyword("group") {
            expect_keyword(&mut c, "by", "BY")?;
            loop {
                let token = c.peek().clone();
                match parse_expression(&mut c)? {
                    Expr::Body(steps) => group_by.push(steps),
                    _ => return Err(unexpected(&token, "a property path to group by")),
                }
                if !c.eat(&Tok::Comma) {
                    break;
                }
            }
        }
        if !c.at(&Tok::End) {
            return Err(unexpected(
                c.peek(),
                "WHERE, GROUP BY or the end of the query",
            ));
        }
        let mut statement = Statement {
            top,
            projection,
            from,
            filter,
            group_by,
        };
        statement.canonicalize();
        statement.check(group_pos)?;
        Ok(statement)
    }

    /// The identities a scheduled job or configuration targets: `*` (every device), a bare
    /// condition on device twins, or `FROM devices[.modules] [WHERE condition]`. Read as IoT
    /// Hub reads it, as the query `SELECT * FROM devices WHERE <condition>` (or `SELECT *
    /// <FROM ...>`), so errors name columns of that query.
    ///
    /// # Errors
    /// [`QueryError`] for a condition that does not parse or selects device jobs.
    pub fn target(condition: &str) -> Result<Statement, QueryError> {
        let trimmed = condition.trim();
        let text = if trimmed == "*" || trimmed.is_empty() {
            "SELECT * FROM devices".to_string()
        } else if trimmed
            .get(..5)
            .is_some_and(|w| w.eq_ignore_ascii_case("from "))
        {
            format!("SELECT * {trimmed}")
        } else {
            format!("SELECT * FROM devices WHERE {trimmed}")
        };
        let statement = Statement::parse(&text)?;
        if statement.from == Collection::Jobs {
            return Err(QueryError::Invalid {
                pos: 0,
                message: "a target is devices or devices.modules, not devices.jobs".into(),
            });
        }
        Ok(statement)
    }

    /// Whether the rows are aggregated (aggregates in the select list, or GROUP BY).
    pub(crate) fn aggregated(&self) -> bool {
        !self.group_by.is_empty()
            || matches!(&self.projection, Projection::Items(items)
                if items.iter().any(|i| matches!(i.value, ItemValue::Aggregate(_))))
    }

    /// Whether rows are whole twins (`SELECT *` on devices or modules), as opposed to raw
    /// projections: IoT Hub's `x-ms-item-type`.
    pub fn item_type(&self) -> &'static str {
        match (&self.projection, self.from) {
            (Projection::Star, Collection::Jobs) => "deviceJob",
            (Projection::Star, _) => "twin",
            _ => "raw",
        }
    }

    pub fn top(&self) -> Option<usize> {
        self.top
    }

    fn canonicalize(&mut self) {
        let roots = match self.from {
            Collection::Jobs => JOB_ROOTS,
            _ => TWIN_ROOTS,
        };
        let mut fix = |steps: &mut Vec<Step>| canonical_path(steps, roots);
        if let Some(filter) = &mut self.filter {
            filter.visit_paths(&mut fix);
        }
        for steps in &mut self.group_by {
            fix(steps);
        }
        if let Projection::Items(items) = &mut self.projection {
            for item in items.iter_mut() {
                match &mut item.value {
                    ItemValue::Plain(e)
                    | ItemValue::Aggregate(
                        Aggregate::Sum(e)
                        | Aggregate::Avg(e)
                        | Aggregate::Min(e)
                        | Aggregate::Max(e),
                    ) => e.visit_paths(&mut fix),
                    ItemValue::Aggregate(Aggregate::Count) => {}
                }
            }
            name_items(items);
        }
    }

    fn check(&self, group_pos: usize) -> Result<(), QueryError> {
        let Projection::Items(items) = &self.projection else {
            if !self.group_by.is_empty() {
                return Err(QueryError::Invalid {
                    pos: group_pos,
                    message:
                        "GROUP BY needs a select list of grouped properties and aggregates, not *"
                            .into(),
                });
            }
            return Ok(());
        };
        let mut names = std::collections::HashSet::new();
        for item in items {
            if !names.insert(item.name.as_str()) {
                return Err(QueryError::Invalid {
                    pos: 0,
                    message: format!("the select list names '{}' twice", item.name),
                });
            }
        }
        if self.aggregated() {
            for item in items {
                if let ItemValue::Plain(expr) = &item.value {
                    let grouped =
                        matches!(expr, Expr::Body(steps) if self.group_by.contains(steps));
                    if !grouped {
                        return Err(QueryError::Invalid {
                            pos: group_pos,
                            message: format!(
                                "'{}' must be an aggregate or a property of the GROUP BY clause",
                                item.name
                            ),
                        });
                    }
                }
            }
        }
        Ok(())
    }
}

fn expect_keyword(c: &mut Cursor, keyword: &str, shown: &str) -> Parsed<()> {
    if c.eat_keyword(keyword) {
        Ok(())
    } else {
        Err(unexpected(c.peek(), shown))
    }
}

fn top(c: &mut Cursor) -> Parsed<Option<usize>> {
    if !c.eat_keyword("top") {
        return Ok(None);
    }
    let token = c.advance();
    match &token.tok {
        Tok::Num(n) => n
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| unexpected(&token, "a non-negative integer after TOP")),
        _ => Err(unexpected(&token, "a non-negative integer after TOP")),
    }
}

fn items(c: &mut Cursor) -> Parsed<Vec<Item>> {
    let mut items = Vec::new();
    loop {
        let value = match aggregate(c)? {
            Some(a) => ItemValue::Aggregate(a),
            None => ItemValue::Plain(parse_expression(c)?),
        };
        let name = if c.eat_keyword("as") {
            let token = c.advance();
            match token.tok {
                Tok::Ident(name) | Tok::Bracketed(name) => name,
                _ => return Err(unexpected(&token, "a name after AS")),
            }
        } else {
            String::new()
        };
        items.push(Item { value, name });
        if !c.eat(&Tok::Comma) {
            return Ok(items);
        }
    }
}

/// `COUNT()`, `SUM(e)`, `AVG(e)`, `MIN(e)`, `MAX(e)` at the cursor, if one is there.
fn aggregate(c: &mut Cursor) -> Parsed<Option<Aggregate>> {
    let Tok::Ident(word) = &c.peek().tok else {
        return Ok(None);
    };
    let word = word.to_ascii_lowercase();
    if !matches!(word.as_str(), "count" | "sum" | "avg" | "min" | "max") || !c.next_is(&Tok::LParen)
    {
        return Ok(None);
    }
    c.advance();
    c.advance();
    if word == "count" {
        c.expect(&Tok::RParen, "')' (COUNT takes no argument)")?;
        return Ok(Some(Aggregate::Count));
    }
    let inner = parse_expression(c)?;
    c.expect(&Tok::RParen, "')'")?;
    Ok(Some(match word.as_str() {
        "sum" => Aggregate::Sum(inner),
        "avg" => Aggregate::Avg(inner),
        "min" => Aggregate::Min(inner),
        _ => Aggregate::Max(inner),
    }))
}

fn collection(c: &mut Cursor) -> Parsed<Collection> {
    if !c.at_keyword("devices") {
        return Err(unexpected(
            c.peek(),
            "a collection (devices, devices.modules or devices.jobs)",
        ));
    }
    c.advance();
    if !c.eat(&Tok::Dot) {
        return Ok(Collection::Devices);
    }
    if c.eat_keyword("modules") {
        Ok(Collection::Modules)
    } else if c.eat_keyword("jobs") {
        Ok(Collection::Jobs)
    } else {
        Err(unexpected(c.peek(), "modules or jobs after 'devices.'"))
    }
}

/// Drops a collection prefix and spells the root (and `properties.desired|reported`)
/// canonically.
fn canonical_path(steps: &mut Vec<Step>, roots: &[&str]) {
    let is = |s: &Step, name: &str| matches!(s, Step::Field(f) if f.eq_ignore_ascii_case(name));
    if steps.len() > 1 && is(&steps[0], "devices") {
        let prefix = if steps.len() > 2 && (is(&steps[1], "modules") || is(&steps[1], "jobs")) {
            2
        } else {
            1
        };
        steps.drain(..prefix);
    }
    if let Some(Step::Field(first)) = steps.first_mut() {
        if let Some(root) = roots.iter().find(|r| r.eq_ignore_ascii_case(first)) {
            *first = (*root).to_string();
        }
    }
    if steps.len() > 1 && matches!(&steps[0], Step::Field(f) if f == "properties") {
        if let Step::Field(section) = &mut steps[1] {
            for canonical in ["desired", "reported"] {
                if section.eq_ignore_ascii_case(canonical) {
                    *section = canonical.to_string();
                }
            }
        }
    }
}

/// Output names: the alias, a path's last field name, or `$n` by position.
fn name_items(items: &mut [Item]) {
    for (n, item) in items.iter_mut().enumerate() {
        if !item.name.is_empty() {
            continue;
        }
        item.name = match &item.value {
            ItemValue::Plain(Expr::Body(steps)) => steps
                .iter()
                .rev()
                .find_map(|s| match s {
                    Step::Field(f) => Some(f.clone()),
                    Step::Index(_) => None,
                })
                .unwrap_or_else(|| format!("${}", n + 1)),
            _ => format!("${}", n + 1),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Statement {
        Statement::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    fn error(text: &str) -> String {
        Statement::parse(text).expect_err(text).to_string()
    }

    #[test]
    fn clauses_collections_and_names() {
        let s = parse("SELECT * FROM devices WHERE tags.location.plant = 'Redmond43'");
        assert_eq!(s.from, Collection::Devices);
        assert_eq!(s.item_type(), "twin");
        assert!(s.filter.is_some() && !s.aggregated());
        assert_eq!(
            parse("select * from devices.modules").from,
            Collection::Modules
        );
        assert_eq!(parse("SELECT * FROM devices.jobs").item_type(), "deviceJob");
        let s = parse("SELECT TOP 3 DeviceId, properties.Reported.temp AS t, 1 + 1 FROM devices");
        assert_eq!(s.top, Some(3));
        assert_eq!(s.item_type(), "raw");
        let Projection::Items(items) = &s.projection else {
            panic!()
        };
        let names: Vec<_> = items.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, ["deviceId", "t", "$3"]);
        assert!(
            matches!(&items[1].value, ItemValue::Plain(Expr::Body(steps))
            if steps == &[Step::Field("properties".into()), Step::Field("reported".into()), Step::Field("temp".into())])
        );
        let s = parse(
            "SELECT devices.jobs.deviceId FROM devices.jobs WHERE devices.jobs.status = 'failed'",
        );
        let Projection::Items(items) = &s.projection else {
            panic!()
        };
        assert!(
            matches!(&items[0].value, ItemValue::Plain(Expr::Body(steps)) if steps == &[Step::Field("deviceId".into())])
        );
        let s = parse("SELECT properties.reported.fw AS fw, COUNT() AS n FROM devices GROUP BY properties.reported.fw");
        assert!(s.aggregated());
        assert!(parse("SELECT COUNT() AS n FROM devices").aggregated());
        parse("SELECT * FROM devices WHERE configurations.[[cfg 1]].status = 'Applied' AND tags.a[0] IN ['x', 'y'] AND NOT (x NIN [1, -2.5, null])");
        parse("SELECT * FROM devices WHERE STARTSWITH(deviceId, 'a') AND ENDSWITH(deviceId, 'b') AND properties.reported.$metadata.x.$lastUpdated > '2020'");
    }

    #[test]
    fn malformed_queries_name_the_position() {
        let cases = [
            ("", "at 0: the query is empty"),
            ("SELEC * FROM devices", "at 0: expected SELECT but found identifier 'SELEC'"),
            ("SELECT * FORM devices", "at 9: expected FROM but found identifier 'FORM'"),
            ("SELECT * FROM devics", "at 14: expected a collection (devices, devices.modules or devices.jobs) but found identifier 'devics'"),
            ("SELECT * FROM devices.twins", "at 22: expected modules or jobs after 'devices.' but found identifier 'twins'"),
            ("SELECT * FROM devices WHERE", "at 27: expected an expression but found end of condition"),
            ("SELECT * FROM devices WHERE a = 1 ORDER BY a", "at 34: expected WHERE, GROUP BY or the end of the query but found identifier 'ORDER'"),
            ("SELECT * FROM devices WHERE STARTS_WITH(deviceId, 'a')", "at 28: unknown function 'STARTS_WITH'"),
            ("SELECT * FROM devices WHERE a IN ('x')", "at 33: expected '[' opening a list of constants but found '('"),
            ("SELECT * FROM devices WHERE a IN [b]", "at 34: expected a constant but found identifier 'b'"),
            ("SELECT COUNT(x) FROM devices", "at 13: expected ')' (COUNT takes no argument) but found identifier 'x'"),
            ("SELECT deviceId, COUNT() FROM devices", "at 37: 'deviceId' must be an aggregate or a property of the GROUP BY clause"),
            ("SELECT * FROM devices GROUP BY status", "at 22: GROUP BY needs a select list of grouped properties and aggregates, not *"),
            ("SELECT a AS x, b AS x FROM devices", "at 0: the select list names 'x' twice"),
            ("SELECT TOP x * FROM devices", "at 11: expected a non-negative integer after TOP but found identifier 'x'"),
            ("SELECT * FROM devices WHERE tags.[[x", "at 33: expected ']' to close the property name but found end of condition"),
        ];
        for (text, expected) in cases {
            assert_eq!(error(text), expected, "{text:?}");
        }
        assert!(error(&"x".repeat(MAX_QUERY_LEN + 1)).contains("longer than 8192"));
    }

    #[test]
    fn targets_are_star_a_condition_or_a_from_clause() {
        assert_eq!(Statement::target("*").unwrap().from, Collection::Devices);
        let bare = Statement::target("tags.x = 'y'").unwrap();
        assert!(bare.filter.is_some() && bare.from == Collection::Devices);
        let modules = Statement::target("FROM devices.modules WHERE moduleId = 'm'").unwrap();
        assert_eq!(modules.from, Collection::Modules);
        assert!(Statement::target("from devices.jobs").is_err());
        let e = Statement::target("tags.x = = 'y'").unwrap_err().to_string();
        assert!(e.starts_with("at 37:"), "{e}");
    }
}
