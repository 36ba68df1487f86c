# Model (not a measurement) of the wgmma score grid's makespan on 132 SMs, one CTA per SM, CTAs
# dispatched in grid order to the SM that frees first; a CTA costs ov + regions / 64 tile units.
# Compares tiles first to last (fwd) with last to first (rev, ScorePlan::longest_first) at
# bench_indexer's scores_prefill shapes (step5_preview tp 1, Il 16). Run: python3 score_grid_order_model.py
import heapq
def plan(T,B,ld,Il,N,sms):
    tok=N//Il; tiles_upper=(T+tok-1)//tok+B
    rpc=4096
    while rpc>128 and tiles_upper*((ld+rpc-1)//rpc) < 2*sms: rpc//=2
    return tok,tiles_upper,rpc,(ld+rpc-1)//rpc
def sim(T,hist,Il,N,sms,rev,ov):
    B=1; ld=(hist+T)//8
    tok,tu,rpc,ch=plan(T,B,ld,Il,N,sms)
    ntiles=(T+tok-1)//tok
    jobs=[]
    for y in range(ch):
        xs=range(tu)
        if rev: xs=reversed(range(tu))
        for x in xs:
            if x>=ntiles: jobs.append(0.02); continue
            last=hist+min((x+1)*tok,T)-1
            n=min(last//8,ld)
            rb=y*rpc
            if rb>=n: jobs.append(0.02); continue
            w=min(rpc,n-rb)
            jobs.append(ov+w/64.0)   # in 64-region tile units
    h=[0.0]*sms
    for j in jobs:
        t=heapq.heappop(h); heapq.heappush(h,t+j)
    tot=sum(jobs)
    return max(h), tot/sms, rpc, ch, len(jobs)
for (T,hist,N) in [(4096,0,128),(16384,0,256),(4096,32768,256),(16384,32768,256)]:
    for ov in (2,4):
        f=sim(T,hist,16,N,132,False,ov); r=sim(T,hist,16,N,132,True,ov)
        print(f"T {T} hist {hist} N {N} ov {ov}: rpc {f[2]} chunks {f[3]} ctas {f[4]} ideal {f[1]:.1f} fwd {f[0]:.1f} ({f[0]/f[1]:.3f}) rev {r[0]:.1f} ({r[0]/r[1]:.3f}) rev/fwd {r[0]/f[0]:.3f}")
