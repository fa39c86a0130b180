// Hardening checks of the rendered chart (docs/deploy.md, "The chart check"): pod security,
// NetworkPolicies, secure-mode Secret mounts and flags, and render stability.
package main

import (
	"fmt"
	"path"
	"sort"
	"strings"
)

// --- pod security: every render ---

// checkPodSecurity: what the restricted Pod Security Standard asks of a pod, apart from its
// volume types: seccomp RuntimeDefault, non-root, no privilege escalation, all capabilities
// dropped and none added, a read-only root filesystem. No container (init ones included) runs as
// root; hostPath directories are prepared on the node (type Directory), never created by the
// kubelet as root-owned 0755 directories a non-root process cannot write.
func (c *checker) checkPodSecurity(o *object, spec map[string]interface{}) {
	psc := m(spec["securityContext"])
	podSeccomp := s(get(psc, "seccompProfile", "type"))
	podNonRoot, _ := psc["runAsNonRoot"].(bool)
	podUser, podUserSet := isInt(psc["runAsUser"])
	for _, ct := range containers(spec) {
		where := fmt.Sprintf("container %s: ", s(ct["name"]))
		sc := m(ct["securityContext"])
		if seccomp := s(get(sc, "seccompProfile", "type")); seccomp == "" && podSeccomp != "RuntimeDefault" ||
			seccomp != "" && seccomp != "RuntimeDefault" {
			c.errorf(o, "%sseccompProfile is not RuntimeDefault (pod or container securityContext)", where)
		}
		nonRoot := podNonRoot
		if v, ok := sc["runAsNonRoot"].(bool); ok {
			nonRoot = v
		}
		user, userSet := podUser, podUserSet
		if u, ok := isInt(sc["runAsUser"]); ok {
			user, userSet = u, true
		}
		if userSet && user == 0 {
			c.errorf(o, "%sruns as root (runAsUser 0)", where)
		} else if !nonRoot {
			c.errorf(o, "%srunAsNonRoot is not true", where)
		}
		if v, _ := sc["allowPrivilegeEscalation"].(bool); v || sc["allowPrivilegeEscalation"] == nil {
			c.errorf(o, "%sallowPrivilegeEscalation is not false", where)
		}
		if v, _ := sc["readOnlyRootFilesystem"].(bool); !v {
			c.errorf(o, "%sreadOnlyRootFilesystem is not true", where)
		}
		dropsAll := false
		for _, d := range l(get(sc, "capabilities", "drop")) {
			dropsAll = dropsAll || s(d) == "ALL"
		}
		if !dropsAll {
			c.errorf(o, "%scapabilities.drop does not contain ALL", where)
		}
		if add := l(get(sc, "capabilities", "add")); len(add) > 0 {
			c.errorf(o, "%sadds capabilities %v", where, add)
		}
		if v, _ := sc["privileged"].(bool); v {
			c.errorf(o, "%sis privileged", where)
		}
	}
	for _, v := range l(spec["volumes"]) {
		if hp := m(get(v, "hostPath")); hp != nil && s(hp["type"]) != "Directory" {
			c.errorf(o, "volume %s: hostPath type %q: the kubelet would create it root-owned 0755, which the non-root runtime cannot use; use Directory (prepared on the node)", s(get(v, "name")), s(hp["type"]))
		}
	}
}

// checkArgsJoined: a flag value holding " --" is two arguments a template joined by trimming the
// newline between them (the binary then sees neither flag).
func (c *checker) checkArgsJoined(o *object, ct map[string]interface{}) {
	for _, a := range l(ct["args"]) {
		if strings.Contains(s(a), " --") {
			c.errorf(o, "container %s: argument %q holds two flags run together (a template trimmed the newline between them)", s(ct["name"]), s(a))
		}
	}
}

// --- NetworkPolicies: every render that has any ---

// peerSelects: whether a NetworkPolicy peer admits pod p of the release (same namespace).
func peerSelects(peer map[string]interface{}, p pod) bool {
	if peer["ipBlock"] != nil || peer["namespaceSelector"] != nil {
		return false // not the release's own pods as such (checked separately)
	}
	ps, ok := peer["podSelector"]
	if !ok {
		return false
	}
	sel := stringMap(get(ps, "matchLabels"))
	if len(sel) == 0 && get(ps, "matchExpressions") == nil {
		return true // {}: every pod of the namespace
	}
	return selects(sel, p.labels)
}

func policyTypes(o *object) map[string]bool {
	out := map[string]bool{}
	for _, t := range l(get(o.body, "spec", "policyTypes")) {
		out[s(t)] = true
	}
	return out
}

func (c *checker) policiesFor(p pod) []*object {
	var out []*object
	for _, o := range c.objects {
		if o.kind != "NetworkPolicy" {
			continue
		}
		sel := stringMap(get(o.body, "spec", "podSelector", "matchLabels"))
		if selects(sel, p.labels) {
			out = append(out, o)
		}
	}
	return out
}

func binaryOf(p pod) string {
	for _, ct := range l(p.spec["containers"]) {
		if cmd := l(get(ct, "command")); len(cmd) > 0 {
			return path.Base(s(cmd[0]))
		}
	}
	return ""
}

// portNumber resolves a NetworkPolicy port (number or name) against pod p; 0 when unknown.
func portNumber(port interface{}, p pod) int {
	if n, ok := isInt(port); ok {
		return n
	}
	for _, ct := range containers(p.spec) {
		for _, cp := range l(ct["ports"]) {
			if s(get(cp, "name")) == s(port) {
				n, _ := isInt(get(cp, "containerPort"))
				return n
			}
		}
	}
	return 0
}

// ruleAllowsPort: whether a rule's ports include `port` of pod p (no ports = every port).
func ruleAllowsPort(rule interface{}, port int, p pod) bool {
	ports := l(get(rule, "ports"))
	if len(ports) == 0 {
		return true
	}
	for _, pp := range ports {
		lo := portNumber(get(pp, "port"), p)
		hi := lo
		if e, ok := isInt(get(pp, "endPort")); ok {
			hi = e
		}
		if port >= lo && port <= hi {
			return true
		}
	}
	return false
}

// reaches: whether pod src may open a connection to pod dst's port under the policies (both
// ends' policies must allow it, as in Kubernetes).
func (c *checker) reaches(src, dst pod, port int) bool {
	egressOK := true
	for _, pol := range c.policiesFor(src) {
		if !policyTypes(pol)["Egress"] {
			continue
		}
		egressOK = false
		break
	}
	if !egressOK {
		for _, pol := range c.policiesFor(src) {
			if !policyTypes(pol)["Egress"] {
				continue
			}
			for _, rule := range l(get(pol.body, "spec", "egress")) {
				to := l(get(rule, "to"))
				peerOK := len(to) == 0
				for _, peer := range to {
					peerOK = peerOK || peerSelects(m(peer), dst)
				}
				if peerOK && ruleAllowsPort(rule, port, dst) {
					egressOK = true
				}
			}
		}
	}
	ingressOK := true
	for _, pol := range c.policiesFor(dst) {
		if policyTypes(pol)["Ingress"] {
			ingressOK = false
			break
		}
	}
	if !ingressOK {
		for _, pol := range c.policiesFor(dst) {
			if !policyTypes(pol)["Ingress"] {
				continue
			}
			for _, rule := range l(get(pol.body, "spec", "ingress")) {
				from := l(get(rule, "from"))
				peerOK := len(from) == 0
				for _, peer := range from {
					peerOK = peerOK || peerSelects(m(peer), src)
				}
				if peerOK && ruleAllowsPort(rule, port, dst) {
					ingressOK = true
				}
			}
		}
	}
	return egressOK && ingressOK
}

// checkNetworkPolicies: when the render has NetworkPolicies, every pod is covered for ingress
// and egress; no ingress rule admits every source, every namespace or every port; egress goes to
// pods of the release, or to any destination only for DNS (53) and an external Redis's port;
// routers cannot reach tierd.
func (c *checker) checkNetworkPolicies() {
	var policies []*object
	for _, o := range c.objects {
		if o.kind == "NetworkPolicy" {
			policies = append(policies, o)
		}
	}
	if len(policies) == 0 {
		return
	}
	openEgressPorts := map[int]bool{53: true}
	for _, p := range c.pods() {
		for _, ct := range containers(p.spec) {
			for _, a := range l(ct["args"]) {
				if v := strings.TrimPrefix(s(a), "--redis_address="); v != s(a) {
					if i := strings.LastIndex(v, ":"); i >= 0 {
						if n, ok := isInt(float64(atoiOr(v[i+1:], 0))); ok && n > 0 {
							// An external Redis (not a Service of the release) may be anywhere.
							if c.byID["Service/"+strings.Split(v[:i], ".")[0]] == nil {
								openEgressPorts[n] = true
							}
						}
					}
				}
			}
		}
	}
	for _, p := range c.pods() {
		types := map[string]bool{}
		for _, pol := range c.policiesFor(p) {
			for t := range policyTypes(pol) {
				types[t] = true
			}
		}
		for _, t := range []string{"Ingress", "Egress"} {
			if !types[t] {
				c.errorf(p.owner, "no NetworkPolicy limits the %s of its pods", strings.ToLower(t))
			}
		}
	}
	for _, pol := range policies {
		for i, rule := range l(get(pol.body, "spec", "ingress")) {
			from := l(get(rule, "from"))
			if len(from) == 0 {
				c.errorf(pol, "ingress[%d] has no 'from': it admits every source", i)
			}
			if len(l(get(rule, "ports"))) == 0 {
				c.errorf(pol, "ingress[%d] has no ports: it admits every port", i)
			}
			for _, peer := range from {
				ns := get(peer, "namespaceSelector")
				if ns != nil && len(stringMap(get(ns, "matchLabels"))) == 0 && get(ns, "matchExpressions") == nil &&
					get(peer, "podSelector") == nil {
					c.errorf(pol, "ingress[%d] admits every namespace (namespaceSelector: {})", i)
				}
				if cidr := s(get(peer, "ipBlock", "cidr")); cidr == "0.0.0.0/0" || cidr == "::/0" {
					c.errorf(pol, "ingress[%d] admits every address (ipBlock %s)", i, cidr)
				}
			}
		}
		for i, rule := range l(get(pol.body, "spec", "egress")) {
			ports := l(get(rule, "ports"))
			if len(ports) == 0 {
				c.errorf(pol, "egress[%d] has no ports: it allows every port", i)
			}
			if len(l(get(rule, "to"))) == 0 {
				for _, pp := range ports {
					n, _ := isInt(get(pp, "port"))
					if !openEgressPorts[n] || get(pp, "endPort") != nil {
						c.errorf(pol, "egress[%d] allows port %v to any destination (only DNS and an external Redis may be anywhere)", i, get(pp, "port"))
					}
				}
			}
		}
	}
	// Routers never call tierd: tier residency reaches them through Redis.
	for _, src := range c.pods() {
		if binaryOf(src) != "pd-router" {
			continue
		}
		for _, dst := range c.pods() {
			if binaryOf(dst) != "pd-tierd" {
				continue
			}
			for _, ct := range containers(dst.spec) {
				for _, cp := range l(ct["ports"]) {
					if n, ok := isInt(get(cp, "containerPort")); ok && c.reaches(src, dst, n) {
						c.errorf(src.owner, "its pods can reach %s's port %d (routers must not reach tierd)", dst.owner.id(), n)
					}
				}
			}
		}
	}
}

func atoiOr(text string, fallback int) int {
	n := 0
	if text == "" {
		return fallback
	}
	for _, r := range text {
		if r < '0' || r > '9' {
			return fallback
		}
		n = n*10 + int(r-'0')
	}
	return n
}

// --- secure mode: with --expect-secure ---

// secureFlags: the file flags each binary must get in secure mode (docs/security.md).
var secureFlags = map[string][]string{
	"pd-router": {"tls_cert", "tls_key", "client_tls_ca", "client_tls_cert", "client_tls_key",
		"cluster_token_file", "api_keys_file"},
	"pd-worker": {"tls_cert", "tls_key", "tls_ca", "client_tls_ca", "client_tls_cert",
		"client_tls_key", "cluster_token_file"},
	"pd-tierd": {"tls_cert", "tls_key", "tls_ca", "cluster_token_file"},
}

// checkSecureMode: every pdserve binary gets its secure-mode flags, each naming a file of a
// Secret volume mounted in its container (the key the flag names is one the volume projects);
// so does --redis_password_file wherever --redis_address is given with Redis AUTH on.
func (c *checker) checkSecureMode() {
	seen := map[string]bool{}
	for _, p := range c.pods() {
		volumes := map[string]map[string]interface{}{}
		for _, v := range l(p.spec["volumes"]) {
			volumes[s(get(v, "name"))] = m(v)
		}
		for _, ct := range l(p.spec["containers"]) {
			cmd := l(get(ct, "command"))
			if len(cmd) == 0 {
				continue
			}
			bin := path.Base(s(cmd[0]))
			want, ok := secureFlags[bin]
			if !ok {
				continue
			}
			seen[bin] = true
			where := fmt.Sprintf("container %s: ", s(get(ct, "name")))
			flags := map[string]string{}
			for _, a := range l(get(ct, "args")) {
				if n, v, ok := strings.Cut(strings.TrimPrefix(s(a), "--"), "="); ok {
					flags[n] = v
				}
			}
			need := append([]string{}, want...)
			if _, ok := flags["redis_address"]; ok {
				need = append(need, "redis_password_file")
			}
			for _, f := range need {
				file, ok := flags[f]
				if !ok {
					c.errorf(p.owner, "%ssecure mode: --%s is missing", where, f)
					continue
				}
				if msg := secretFile(m(ct), volumes, file); msg != "" {
					c.errorf(p.owner, "%ssecure mode: --%s=%s %s", where, f, file, msg)
				}
			}
		}
	}
	var missing []string
	for bin := range secureFlags {
		if !seen[bin] {
			missing = append(missing, bin)
		}
	}
	sort.Strings(missing)
	for _, bin := range missing {
		if bin != "pd-tierd" { // tierd may be disabled
			c.errorf(nil, "secure mode: no container runs %s", bin)
		}
	}
}

// secretFile: "" when `file` lies in a read-only mount of a Secret volume that projects it.
func secretFile(ct map[string]interface{}, volumes map[string]map[string]interface{}, file string) string {
	best, bestVol, readOnly := "", "", false
	for _, vm := range l(ct["volumeMounts"]) {
		mp := strings.TrimSuffix(s(get(vm, "mountPath")), "/")
		if strings.HasPrefix(file, mp+"/") && len(mp) > len(best) {
			best, bestVol = mp, s(get(vm, "name"))
			readOnly, _ = get(vm, "readOnly").(bool)
		}
	}
	if best == "" {
		return "is on no mounted volume"
	}
	v := volumes[bestVol]
	if v == nil || v["secret"] == nil {
		return fmt.Sprintf("is on volume %s, which is not a Secret", bestVol)
	}
	if !readOnly {
		return fmt.Sprintf("is on volume %s, which is not mounted readOnly", bestVol)
	}
	rel := strings.TrimPrefix(file, best+"/")
	items := l(get(v, "secret", "items"))
	if len(items) == 0 {
		return ""
	}
	for _, it := range items {
		if s(get(it, "path")) == rel {
			return ""
		}
	}
	return fmt.Sprintf("is not a file of Secret volume %s (it projects other paths)", bestVol)
}
