// Package console is the router's web console, served at /console: plain
// HTML, one vanilla JavaScript file and one stylesheet, embedded in the
// binary (go:embed), with no build step and no library: the charts are
// inline SVG built in the DOM.
//
// The console is a client of the public JSON API and nothing else: every
// number it shows and every change it makes goes through a /v1/ route of
// the grpc-gateway (the routes it may call are listed in ROUTES at the
// top of assets/console.js, and a test checks each against the OpenAPI
// document), so it can do nothing a key could not do with curl, and the
// key's roles decide what it may do.
//
// # Pages
//
// Topics: a namespace's topics with their depth by state and by
// priority, the oldest ready age, a badge on each topic on pause and a
// button that pauses or resumes it, and a chart of the namespace's items
// enqueued, delivered, acked and dead-lettered per second over the last
// hour (GetThroughput). The chart's figures are the answering node's own
// counters (schema/metrics keeps a ring of 10-second intervals per
// namespace), so it needs no Prometheus; behind a load balancer each
// refresh may ask another node and show that node's share. They are the
// namespace's only, as the key's namespace decides.
//
// Items: a topic's items in one state (ready, leased or delayed), in
// delivery order, within a priority range, a page at a time (ListItems;
// Next follows the answer's page token, Previous goes back to a token
// kept in the page), with a priority change (UpdateItem, recorded as
// changed by "console") and a delete (DeleteItem) on each row, and the
// topic's pause or resume.
//
// Item: one item's every field (GetItem). Dead letters: a topic's dead
// letters a hundred a page, oldest first, with redrive and delete of one
// row, of the selected ones, or of all. Shards: the shard map with each
// shard's primary, replicas and epoch beside the failover controller's
// recent steps. Drills: the failover drills reported through
// Admin.ReportDrill (GET /v1/drills), the selected drill's progress as a
// live log, polled every second while that page is shown.
//
// Every change asks first (confirm()), but a priority change and a
// resume, which are as easily undone as made.
//
// # Keys
//
// When the node has a keys file, the API wants "authorization: Bearer
// <key>": the console asks for the key and keeps it in the tab's
// sessionStorage (gone when the tab closes), never in a cookie, so the
// console's own pages need no authentication and carry no credentials.
// The pages are served with a Content-Security-Policy that admits only
// the console's own script and stylesheet.
package console
