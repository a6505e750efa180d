package consoletest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
)

// Width and Height are the tab's viewport, which is the size of every
// screenshot.
const Width, Height = 1280, 800

// Wait bounds each step: a DOM condition that does not hold within it
// fails the test with the page's state.
const Wait = 30 * time.Second

// ExecPath returns the Chromium to drive: $TRIAGE_CHROMIUM, else the first
// of chromium, chromium-browser, google-chrome on PATH.
func ExecPath() (string, error) {
	if p := os.Getenv("TRIAGE_CHROMIUM"); p != "" {
		found, err := exec.LookPath(p)
		if err != nil {
			return "", fmt.Errorf("TRIAGE_CHROMIUM=%s: %w", p, err)
		}
		return found, nil
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", errors.New("no chromium, chromium-browser or google-chrome on PATH: run make deps " +
		"(.ci/ensure-chromium: apt-get install -y chromium, as root) or set TRIAGE_CHROMIUM to a Chrome or Chromium binary")
}

// Need fails the test now when there is no Chromium to drive, before it
// sets anything else up.
func Need(t testing.TB) {
	t.Helper()
	if _, err := ExecPath(); err != nil {
		t.Fatalf("the console's browser test needs Chromium: %v", err)
	}
}

// Browser is one headless Chromium with one tab on the console.
type Browser struct {
	t   testing.TB
	ctx context.Context
	url string
	dir string

	mu       sync.Mutex
	messages []chromedp.ConsoleMessage
	dialogs  []string
}

// Start starts Chromium and opens consoleURL (http://ROUTER/console/) in
// its tab. The browser is closed when the test ends; a Chromium process
// left running then fails the test.
func Start(t testing.TB, consoleURL string) *Browser {
	t.Helper()
	path, err := ExecPath()
	if err != nil {
		t.Fatalf("the console's browser test needs Chromium: %v", err)
	}
	profile, err := os.MkdirTemp("", "triage-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		// Our own profile directory, so that the cleanup can find every
		// process of this browser by it.
		chromedp.UserDataDir(profile),
		// Its crash handler keeps its database under the configuration
		// directory, not the profile: point both there, so that nothing is
		// written to the user's home and the handler is found by it too.
		chromedp.Env("XDG_CONFIG_HOME="+profile, "XDG_CACHE_HOME="+profile),
		chromedp.WindowSize(Width, Height),
		// Chromium does not start as root with its sandbox (CI runs as
		// root in a container); as any other user it keeps it.
		chromedp.Flag("no-sandbox", os.Geteuid() == 0),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.Flag("lang", "en-US"),
	)
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	b := &Browser{t: t, ctx: ctx, url: consoleURL, dir: artifactDir(t)}
	t.Cleanup(func() {
		cancel()
		acancel() // kills the browser if it is still running, and waits
		if left := waitGone(profile, 5*time.Second); len(left) > 0 {
			for _, pid := range left {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			t.Errorf("Chromium processes of this test still ran after the browser was closed (killed now): %v", left)
		}
		_ = os.RemoveAll(profile)
	})
	if err := chromedp.Do(ctx); err != nil { // starts the browser, bound to ctx
		t.Fatalf("starting %s: %v", path, err)
	}
	if p := chromedp.FromContext(ctx).Browser.Process(); p != nil {
		t.Logf("chromium %s pid %d, profile %s", path, p.Pid, profile)
	}
	// Both loops end when ctx does.
	messages := chromedp.Console(ctx)
	go func() {
		for m, err := range messages {
			if err != nil {
				return
			}
			b.mu.Lock()
			b.messages = append(b.messages, m)
			b.mu.Unlock()
		}
	}()
	// The console asks before it redrives (confirm()): the operator says
	// yes. The question is kept for the test to check.
	dialogs := chromedp.Events(ctx, page.JavascriptDialogOpening)
	go func() {
		for ev, err := range dialogs {
			if err != nil {
				return
			}
			b.mu.Lock()
			b.dialogs = append(b.dialogs, ev.Message)
			b.mu.Unlock()
			_, _ = chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: true})
		}
	}()
	b.Do("open "+consoleURL, chromedp.EmulateViewport(Width, Height), chromedp.Navigate(consoleURL), chromedp.WaitReady(chromedp.CSS("#view-topics")))
	return b
}

// Do runs actions, each step within Wait; on an error it fails the test
// with what and the page's state.
func (b *Browser) Do(what string, actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, Wait)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		b.t.Fatalf("%s: %v\n%s", what, err, b.State())
	}
}

// Eval evaluates the JavaScript expression expr in the page and decodes
// its value into T.
func Eval[T any](b *Browser, expr string) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, Wait)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		b.t.Fatalf("evaluating %s: %v\n%s", expr, err, b.State())
	}
	return v
}

// WaitFor waits until the JavaScript expression cond is truthy in the
// page (polled every 50 ms, at most Wait); what says what it waits for.
func (b *Browser) WaitFor(what, cond string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, Wait+5*time.Second)
	defer cancel()
	_, err := chromedp.Run(ctx, chromedp.Poll[any](cond, chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(Wait)))
	if err != nil {
		b.t.Fatalf("waiting for %s (%s): %v\n%s", what, cond, err, b.State())
	}
}

// UseKey types key into the console's API key field and submits the
// settings form, as an operator does; the console keeps it in the tab's
// sessionStorage and sends it as "authorization: Bearer".
func (b *Browser) UseKey(namespace, key string) {
	b.t.Helper()
	b.Do("enter the API key",
		chromedp.SetValue(chromedp.ID("namespace"), namespace),
		chromedp.SendKeys(chromedp.ID("key"), key),
		chromedp.Click(chromedp.CSS(`#settings button[type="submit"]`)),
	)
	b.WaitFor("the key kept in sessionStorage", `sessionStorage.getItem("triage.console.key") !== null && document.getElementById("key").value === ""`)
}

// Show clicks the navigation link of view (topics, items, item, deadletters,
// shards, drills) and waits until its section is the one shown.
func (b *Browser) Show(view string) {
	b.t.Helper()
	b.Do("show "+view, chromedp.Click(chromedp.CSS(`nav a[data-view="`+view+`"]`)))
	b.WaitFor("the "+view+" page", `!document.getElementById("view-`+view+`").hidden`)
}

// Screenshot saves the tab's viewport as name.png in the artifact
// directory and returns its path.
func (b *Browser) Screenshot(name string) string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, Wait)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		b.t.Fatalf("screenshot %s: %v\n%s", name, err, b.State())
	}
	path := filepath.Join(b.dir, name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		b.t.Fatal(err)
	}
	return path
}

// Dialogs returns the messages of the dialogs the page opened (and the
// browser accepted), in order.
func (b *Browser) Dialogs() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.dialogs...)
}

// Problems returns what the page must never do: uncaught exceptions and
// unhandled rejections, and loads its Content-Security-Policy refused.
func (b *Browser) Problems() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for _, m := range b.messages {
		if m.IsException() || strings.Contains(m.Text, "Content Security Policy") {
			out = append(out, m.String())
		}
	}
	return out
}

// State describes the page for a failure: its address, the error box,
// the shown section's text and the console's messages.
func (b *Browser) State() string {
	ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
	defer cancel()
	state, err := chromedp.Run(ctx, chromedp.Evaluate[string](`location.href + "\nerror box: " + JSON.stringify(document.getElementById("error").textContent) +
		"\nshown: " + [...document.querySelectorAll("section[data-view]")].filter((s) => !s.hidden).map((s) => s.innerText.slice(0, 2000)).join("\n")`))
	if err != nil {
		state = "(page state unavailable: " + err.Error() + ")"
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	var msgs strings.Builder
	for _, m := range b.messages {
		fmt.Fprintf(&msgs, "\n  %s", m)
	}
	return "--- page ---\n" + state + "\n--- browser console ---" + msgs.String()
}

// artifactDir is where screenshots go: $TRIAGE_ARTIFACTS/<test name> or
// the test's artifact directory. It logs the directory.
func artifactDir(t testing.TB) string {
	dir := t.ArtifactDir()
	if root := os.Getenv("TRIAGE_ARTIFACTS"); root != "" {
		dir = filepath.Join(root, regexp.MustCompile(`[^A-Za-z0-9_.-]+`).ReplaceAllString(t.Name(), "_"))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("screenshots in %s", dir)
	return dir
}

// waitGone waits up to limit until no process runs with the profile
// directory in its arguments (Chromium passes --user-data-dir to every
// child, its crash handler --database under it) and returns the PIDs
// still running.
func waitGone(profile string, limit time.Duration) []int {
	deadline := time.Now().Add(limit)
	for {
		left := processesUsing(profile)
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func processesUsing(profile string) []int {
	want := []byte(profile)
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		for arg := range bytes.SplitSeq(cmdline, []byte{0}) {
			if bytes.Contains(arg, want) {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}
