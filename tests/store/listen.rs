//! Listen-stream slots.

use super::*;

async fn listen_slots_are_capped_leased_renewed_and_freed(store: Arc<dyn Store>) {
    // Real time: Redis times leases by its own clock. A lease of 3 s, renewed at 1.5 s.
    let key = new_id("key");
    let hold = |stream: &'static str| {
        let (store, key) = (store.clone(), key.clone());
        async move {
            store
                .hold_listen_slot(&key, stream, 2, 3_000)
                .await
                .unwrap()
        }
    };
    assert!(hold("s1").await);
    assert!(hold("s2").await);
    assert!(!hold("s3").await, "both slots held");
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(hold("s1").await, "a holder renews its own");
    tokio::time::sleep(Duration::from_millis(1_700)).await;
    // s2's lease ended at 3 s; s1's, renewed, ends at 4.5 s.
    assert!(hold("s3").await, "an expired lease frees its slot");
    assert!(!hold("s4").await);
    store.release_listen_slot(&key, "s1").await.unwrap();
    assert!(hold("s4").await, "a released slot is free");
}

store_suite!(listen_slots_are_capped_leased_renewed_and_freed);
