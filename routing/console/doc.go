// Package console is the router's web console, served at /console: plain
// HTML, one vanilla JavaScript file and one stylesheet, embedded in the
// binary (go:embed), with no build step.
//
// The console is a client of the public JSON API and nothing else: every
// number it shows comes from a /v1/ route of the grpc-gateway (the routes
// it may call are listed in ROUTES at the top of assets/console.js, and a
// test checks each against the OpenAPI document). It shows a namespace's
// topics with their depth by priority and oldest ready age (charts drawn
// as inline SVG), a badge on each topic on pause and a button that pauses
// or resumes it, an item's detail, the dead letters of a topic with
// redrive and delete (of the selected ones, or all), the shard map with each shard's primary, replicas and epoch
// beside the failover controller's recent steps, and the failover drills
// reported through Admin.ReportDrill (GET /v1/drills) with the selected
// drill's progress as a live log, polled every second while that page is
// shown.
//
// When the node has a keys file, the API wants "authorization: Bearer
// <key>": the console asks for the key and keeps it in the tab's
// sessionStorage (gone when the tab closes), never in a cookie, so the
// console's own pages need no authentication and carry no credentials.
// The pages are served with a Content-Security-Policy that admits only
// the console's own script and stylesheet.
package console
