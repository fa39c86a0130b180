// Static checks of deploy/docker: pinned base images, the build image installing exactly
// scripts/setup.sh's package list, runtime images copying binaries that the build produced and
// installing the Debian packages those binaries load.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

type instruction struct {
	line int
	cmd  string // upper case
	args string
}

type stage struct {
	name  string
	image string // after ARG substitution; "" for FROM <earlier stage>
	from  string // as written after substitution
	insts []instruction
}

type dockerfile struct {
	file   string
	stages []*stage
}

var argRef = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)`)

func parseDockerfile(file string) (*dockerfile, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	df := &dockerfile{file: file}
	globalArgs := map[string]string{}
	var cur *stage
	var buf strings.Builder
	start := 0
	sc := bufio.NewScanner(f)
	n := 0
	flush := func() error {
		text := strings.TrimSpace(buf.String())
		buf.Reset()
		if text == "" {
			return nil
		}
		cmd, args, _ := strings.Cut(text, " ")
		in := instruction{line: start, cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args)}
		switch {
		case in.cmd == "ARG" && cur == nil:
			k, v, _ := strings.Cut(in.args, "=")
			globalArgs[k] = strings.Trim(v, `"`)
		case in.cmd == "FROM":
			from := argRef.ReplaceAllStringFunc(in.args, func(ref string) string {
				m := argRef.FindStringSubmatch(ref)
				name := m[1] + m[2]
				return globalArgs[name]
			})
			fields := strings.Fields(from)
			st := &stage{from: from}
			for i, x := range fields {
				if strings.HasPrefix(x, "--") {
					continue
				}
				st.image = x
				if i+2 < len(fields) && strings.EqualFold(fields[i+1], "AS") {
					st.name = fields[i+2]
				}
				break
			}
			for _, prev := range df.stages {
				if prev.name != "" && prev.name == st.image {
					st.image = ""
				}
			}
			df.stages = append(df.stages, st)
			cur = st
		case cur == nil:
			return fmt.Errorf("%s:%d: %s before the first FROM", file, in.line, in.cmd)
		default:
			cur.insts = append(cur.insts, in)
		}
		return nil
	}
	for sc.Scan() {
		n++
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if buf.Len() == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if buf.Len() == 0 {
			start = n
		} else if strings.HasPrefix(trimmed, "#") {
			continue
		}
		if strings.HasSuffix(line, "\\") {
			buf.WriteString(strings.TrimSuffix(line, "\\"))
			buf.WriteString(" ")
			continue
		}
		buf.WriteString(line)
		if err := flush(); err != nil {
			return nil, err
		}
	}
	if err := flush(); err != nil {
		return nil, err
	}
	if len(df.stages) == 0 {
		return nil, fmt.Errorf("%s: no FROM", file)
	}
	return df, sc.Err()
}

var (
	datedTag   = regexp.MustCompile(`(^|[^0-9])[0-9]{8}([^0-9]|$)`)
	semverTag  = regexp.MustCompile(`(^|[^0-9])[0-9]+\.[0-9]+\.[0-9]+`)
	setupArray = regexp.MustCompile(`(?s)PD_PACKAGES=\((.*?)\n\)`)
)

// basePinProblem: a base image is pinned by digest, a dated tag or a full x.y.z version.
func basePinProblem(image string) string {
	if image == "" {
		return "empty image (an ARG without default?)"
	}
	if strings.Contains(image, "@sha256:") {
		return ""
	}
	if msg := imagePinProblem(image); msg != "" {
		return msg
	}
	tag := image[strings.LastIndex(image, ":")+1:]
	if !datedTag.MatchString(tag) && !semverTag.MatchString(tag) {
		return fmt.Sprintf("tag %q floats: pin a dated (bookworm-YYYYMMDD) or x.y.z tag", tag)
	}
	return ""
}

func setupPackages(setup string) ([]string, error) {
	data, err := os.ReadFile(setup)
	if err != nil {
		return nil, err
	}
	mm := setupArray.FindStringSubmatch(string(data))
	if mm == nil {
		return nil, fmt.Errorf("%s: no PD_PACKAGES=( ... ) array", setup)
	}
	var pkgs []string
	for _, line := range strings.Split(mm[1], "\n") {
		line, _, _ = strings.Cut(line, "#")
		pkgs = append(pkgs, strings.Fields(line)...)
	}
	return pkgs, nil
}

// aptInstalls: the packages of every "apt-get install" in a stage.
func aptInstalls(st *stage) []string {
	var out []string
	for _, in := range st.insts {
		if in.cmd != "RUN" {
			continue
		}
		for _, part := range regexp.MustCompile(`&&|;|\|\|`).Split(in.args, -1) {
			f := strings.Fields(part)
			for i := 0; i+1 < len(f); i++ {
				if f[i] == "apt-get" && f[i+1] == "install" {
					for _, x := range f[i+2:] {
						if !strings.HasPrefix(x, "-") {
							out = append(out, x)
						}
					}
				}
			}
		}
	}
	return out
}

type copyFrom struct {
	from    string
	sources []string
	dest    string
}

func copies(st *stage) []copyFrom {
	var out []copyFrom
	for _, in := range st.insts {
		if in.cmd != "COPY" {
			continue
		}
		c := copyFrom{}
		var rest []string
		for _, x := range strings.Fields(in.args) {
			if strings.HasPrefix(x, "--from=") {
				c.from = strings.TrimPrefix(x, "--from=")
			} else if !strings.HasPrefix(x, "--") {
				rest = append(rest, x)
			}
		}
		if len(rest) < 2 {
			continue
		}
		c.sources, c.dest = rest[:len(rest)-1], rest[len(rest)-1]
		out = append(out, c)
	}
	return out
}

// The binaries the Helm chart runs (command: /usr/local/bin/<name>).
var chartBinaries = []string{"pd-router", "pd-worker", "pd-tierd"}

// In every Debian image: never listed.
var essentialPackages = map[string]bool{"libc6": true, "libgcc-s1": true}

const buildPrefix = "/src/build/"

func runDocker(argv []string) int {
	fs := flag.NewFlagSet("docker", flag.ExitOnError)
	dir := fs.String("dir", "", "folder with the Dockerfiles (*.Dockerfile)")
	setup := fs.String("setup", "", "scripts/setup.sh")
	buildDir := fs.String("build-dir", "", "the CMake build directory the check reads binaries from")
	var allowMissing listFlag
	fs.Var(&allowMissing, "allow-missing-bin", "binary that may be unbuilt: its copy and libraries are NOT checked")
	_ = fs.Parse(argv)
	if *dir == "" || *setup == "" || *buildDir == "" {
		usage()
	}
	missingOK := map[string]bool{}
	for _, b := range allowMissing {
		missingOK[b] = true
	}
	var fails []string
	fail := func(format string, args ...interface{}) { fails = append(fails, fmt.Sprintf(format, args...)) }

	pkgs, err := setupPackages(*setup)
	if err != nil {
		fmt.Printf("FAIL: %v\n", err)
		return 1
	}
	files, _ := filepath.Glob(filepath.Join(*dir, "*.Dockerfile"))
	sort.Strings(files)
	if len(files) == 0 {
		fmt.Printf("FAIL: no *.Dockerfile in %s\n", *dir)
		return 1
	}
	sawBuild := false
	for _, file := range files {
		df, err := parseDockerfile(file)
		if err != nil {
			fail("%v", err)
			continue
		}
		base := filepath.Base(file)
		for _, st := range df.stages {
			if st.image == "" {
				continue
			}
			if msg := basePinProblem(st.image); msg != "" {
				fail("%s: FROM %s: %s", base, st.from, msg)
			}
		}
		if strings.HasPrefix(base, "build.") {
			sawBuild = true
			checkBuildImage(df, base, pkgs, fail)
		} else {
			checkRuntimeImage(df, base, *buildDir, missingOK, fail)
		}
	}
	if !sawBuild {
		fail("%s: no build.Dockerfile", *dir)
	}
	if len(fails) > 0 {
		for _, f := range fails {
			fmt.Printf("FAIL: docker: %s\n", f)
		}
		return 1
	}
	fmt.Printf("OK: docker: %d Dockerfiles, base images pinned, build image installs scripts/setup.sh's %d packages, runtime images copy built binaries and install their libraries\n", len(files), len(pkgs))
	return 0
}

// The build image installs PD_PACKAGES by running setup.sh's own pd_install_packages, so the
// two lists cannot drift; it installs nothing else with apt-get.
func checkBuildImage(df *dockerfile, base string, pkgs []string, fail func(string, ...interface{})) {
	final := df.stages[len(df.stages)-1]
	copied, ran := false, false
	for _, c := range copies(final) {
		for _, src := range c.sources {
			if src == "scripts/setup.sh" && c.from == "" {
				copied = true
			}
		}
	}
	for _, in := range final.insts {
		if in.cmd == "RUN" && strings.Contains(in.args, "setup.sh") && strings.Contains(in.args, "pd_install_packages") {
			ran = true
		}
	}
	if !copied || !ran {
		fail("%s: must COPY scripts/setup.sh and RUN its pd_install_packages (the package list lives there)", base)
	}
	if extra := aptInstalls(final); len(extra) > 0 {
		fail("%s: installs %v with apt-get outside scripts/setup.sh; add them to PD_PACKAGES instead", base, extra)
	}
	if len(pkgs) < 10 {
		fail("scripts/setup.sh: PD_PACKAGES has only %d entries", len(pkgs))
	}
}

func checkRuntimeImage(df *dockerfile, base, buildDir string, missingOK map[string]bool, fail func(string, ...interface{})) {
	final := df.stages[len(df.stages)-1]
	installed := map[string]bool{}
	wanted := aptInstalls(final)
	present := map[string]bool{}
	if len(wanted) > 0 {
		out, _ := exec.Command("dpkg-query", append([]string{"-W", "-f=${Package} ${Status}\\n"}, wanted...)...).Output()
		for _, line := range strings.Split(string(out), "\n") {
			if f := strings.Fields(line); len(f) >= 1 && strings.HasSuffix(line, "install ok installed") {
				present[f[0]] = true
			}
		}
	}
	for _, p := range wanted {
		installed[p] = true
		// A real Debian 12 package: the build's -dev packages pull each runtime library in.
		if !present[p] {
			fail("%s: apt-get install %s: not a package installed on this Debian 12 build machine", base, p)
		}
	}
	stages := map[string]*stage{}
	for _, st := range df.stages {
		if st.name != "" {
			stages[st.name] = st
		}
	}
	cudaCopies := []string{}
	provided := map[string]bool{}
	buildTargets := ""
	for _, st := range df.stages {
		for _, in := range st.insts {
			if in.cmd == "RUN" && strings.Contains(in.args, "cmake --build") {
				buildTargets += " " + in.args + " "
			}
		}
	}
	isCPU := strings.Contains(base, "cpu")
	if isCPU && !strings.Contains(buildTargets+allRuns(df), "-DPD_ENABLE_CUDA=OFF") {
		fail("%s: the CPU image must configure with -DPD_ENABLE_CUDA=OFF", base)
	}
	var bins []string
	for _, c := range copies(final) {
		from := stages[c.from]
		if c.from == "" || from == nil {
			continue
		}
		for _, src := range c.sources {
			if strings.HasPrefix(src, buildPrefix) {
				bin := path.Base(src)
				if !strings.HasSuffix(c.dest, "/") {
					fail("%s: COPY of %s: destination %s must be a directory (end with /)", base, bin, c.dest)
				}
				if c.dest == "/usr/local/bin/" {
					provided[bin] = true
				}
				if !strings.Contains(buildTargets, " "+bin+" ") && !strings.Contains(buildTargets, " "+bin+"\"") {
					fail("%s: copies %s but no cmake --build --target builds it", base, bin)
				}
				local := filepath.Join(buildDir, strings.TrimPrefix(src, buildPrefix))
				st, err := os.Stat(local)
				if err != nil {
					if missingOK[bin] {
						fmt.Printf("SKIPPED: %s: %s is not built (%s): its copy and libraries are NOT checked\n", base, bin, local)
						continue
					}
					fail("%s: copies %s, which the build does not produce (%s missing)", base, src, local)
					continue
				}
				if st.Mode()&0o111 == 0 {
					fail("%s: %s is not executable", base, local)
				}
				bins = append(bins, local)
			} else {
				cudaCopies = append(cudaCopies, path.Base(src))
			}
		}
	}
	for _, b := range chartBinaries {
		if !provided[b] {
			fail("%s: does not put %s into /usr/local/bin/ (the Helm chart runs it from there)", base, b)
		}
	}
	for _, bin := range bins {
		libs, err := neededLibraries(bin)
		if err != nil {
			fail("%s: %v", base, err)
			continue
		}
		for _, lib := range libs {
			if strings.Contains(lib.path, "/cuda") {
				if isCPU {
					continue // this build has CUDA; the CPU image's does not (-DPD_ENABLE_CUDA=OFF)
				}
				ok := false
				for _, pattern := range cudaCopies {
					if m, _ := path.Match(pattern, lib.name); m {
						ok = true
					}
				}
				if !ok {
					fail("%s: %s needs %s (%s), which no COPY from a CUDA stage provides", base, filepath.Base(bin), lib.name, lib.path)
				}
				continue
			}
			if lib.pkg == "" {
				fail("%s: %s needs %s (%s), which no Debian package owns", base, filepath.Base(bin), lib.name, lib.path)
				continue
			}
			if !installed[lib.pkg] && !essentialPackages[lib.pkg] {
				fail("%s: %s needs %s from Debian package %s; add it to the apt-get install line", base, filepath.Base(bin), lib.name, lib.pkg)
			}
		}
	}
}

func allRuns(df *dockerfile) string {
	var b strings.Builder
	for _, st := range df.stages {
		for _, in := range st.insts {
			if in.cmd == "RUN" || in.cmd == "ARG" || in.cmd == "ENV" {
				b.WriteString(in.args + "\n")
			}
		}
	}
	return b.String()
}

type neededLib struct{ name, path, pkg string }

// neededLibraries: the binary's direct DT_NEEDED entries, resolved by ldd, and the Debian
// package owning each (dpkg -S on the resolved file, /lib and /usr/lib both tried).
func neededLibraries(bin string) ([]neededLib, error) {
	out, err := exec.Command("readelf", "-d", bin).Output()
	if err != nil {
		return nil, fmt.Errorf("readelf -d %s: %v", bin, err)
	}
	var names []string
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "(NEEDED)") {
			if i, j := strings.Index(line, "["), strings.LastIndex(line, "]"); i >= 0 && j > i {
				names = append(names, line[i+1:j])
			}
		}
	}
	lddOut, err := exec.Command("ldd", bin).Output()
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %v", bin, err)
	}
	resolved := map[string]string{}
	for _, line := range strings.Split(string(lddOut), "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[1] == "=>" {
			resolved[f[0]] = f[2]
		}
	}
	var batch []string
	for _, n := range names {
		if p := resolved[n]; p != "" && p != "not" {
			batch = append(batch, p)
		}
	}
	fillOwners(batch)
	var libs []neededLib
	for _, n := range names {
		lib := neededLib{name: n, path: resolved[n]}
		if strings.HasPrefix(n, "ld-linux") {
			lib.pkg = "libc6"
		} else if lib.path == "" || lib.path == "not" {
			return nil, fmt.Errorf("%s: %s does not resolve (ldd)", bin, n)
		} else {
			lib.pkg = owningPackage(lib.path)
		}
		libs = append(libs, lib)
	}
	return libs, nil
}

// pathCandidates: the file and its resolved target, each under /lib and /usr/lib (merged /usr:
// dpkg knows a file by the path its package ships).
func pathCandidates(p string) []string {
	candidates := []string{p}
	if real, err := filepath.EvalSymlinks(p); err == nil && real != p {
		candidates = append(candidates, real)
	}
	for _, c := range append([]string{}, candidates...) {
		if strings.HasPrefix(c, "/usr/lib/") {
			candidates = append(candidates, strings.TrimPrefix(c, "/usr"))
		} else if strings.HasPrefix(c, "/lib/") {
			candidates = append(candidates, "/usr"+c)
		}
	}
	return candidates
}

// ownerCache: file path -> Debian package, filled by one dpkg -S call per batch (dpkg -S reads
// every package's file list, so one call per file would take seconds each).
var ownerCache = map[string]string{}

func fillOwners(paths []string) {
	var ask []string
	for _, p := range paths {
		for _, c := range pathCandidates(p) {
			if _, ok := ownerCache[c]; !ok {
				ask = append(ask, c)
				ownerCache[c] = ""
			}
		}
	}
	if len(ask) == 0 {
		return
	}
	out, _ := exec.Command("dpkg", append([]string{"-S"}, ask...)...).Output() // exit 1 if any is unowned
	for _, line := range strings.Split(string(out), "\n") {
		pkgs, file, ok := strings.Cut(line, ": ")
		if !ok || strings.HasPrefix(pkgs, "diversion") || strings.Contains(pkgs, ",") {
			continue
		}
		pkg, _, _ := strings.Cut(pkgs, ":") // drop ":amd64"
		ownerCache[strings.TrimSpace(file)] = pkg
	}
}

func owningPackage(p string) string {
	fillOwners([]string{p})
	for _, c := range pathCandidates(p) {
		if pkg := ownerCache[c]; pkg != "" {
			return pkg
		}
	}
	return ""
}
